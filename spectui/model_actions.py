"""ModelActions: switching the model and its speculators inside the app (ctrl+o, the model picker).

A mixin of ChatApp (chat_app.py), which holds `link` (and `run_spec`, what it loads), `chat` and the
config. The picker (screens/models.py) returns a model and a speculator choice; the app closes the
engine process and starts one for them on the path ctrl+e takes (EngineLink.switch, then
`start_engine`: the loading screen, ModelsLoaded or LoadFailed). The conversation stays as it is
and its next turns go to the new model. A switch while an answer streams stops the answer first:
what it streamed is saved, then the switch runs (`after_turn`). Once the new model has loaded, the
choice is saved in the config (`model`, `speculators`), so the next `spectui chat` without --model
starts with it; a model that fails to load leaves one notice line, and ctrl+o picks another.
"""

from __future__ import annotations

from functools import partial

from .screens.models import ModelPickerScreen


class ModelActions:
    model_to_save: tuple[str, str] | None = None  # the picker's choice, saved once it has loaded

    def action_pick_model(self) -> None:
        self.push_screen(ModelPickerScreen(self.run_spec.model, self.run_spec.speculators), self.on_model_picked)

    async def on_model_picked(self, choice: tuple[str, str] | None) -> None:
        if choice:
            await self.after_turn(partial(self.switch_model, *choice), "switch the model")

    async def switch_model(self, model: str, speculators: str) -> None:
        """Close the engine (ready, loading, failed or dead) and start one for this model."""
        self.model_to_save = (model, speculators)
        self.link.switch(model, speculators)  # start_engine below clears `info`: no engine until it loads
        status = self.chat.status
        status.model, status.ssms, status.device, status.engine_pid = model, "-", "-", 0
        self.chat.set_notice(None)
        self.action_skip_loading()  # the palette can pick a model over the loading screen: it gets a new one
        self.start_engine()

    def keep_model_choice(self) -> None:
        """The picked model has loaded: the next start uses it (the config's `model` and `speculators`)."""
        if self.model_to_save is not None:
            model, speculators = self.model_to_save
            self.model_to_save = None
            if self.remember(model=model, speculators=speculators):
                self.notify(f"switched to {model}; the next start loads it too")

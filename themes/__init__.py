"""spectui's Textual themes (dark, light, high contrast, in themes.json) and the app's stylesheet (app.tcss).

Token-origin colours come from the theme too, through the variables `origin-ssm1`,
`origin-ssm2`, `origin-ngram` and `origin-bonus`, so the colouring stays readable in every theme.
A theme in themes.json is a name and the keyword arguments of textual.theme.Theme.
"""

from __future__ import annotations

import json
from pathlib import Path

from textual.theme import Theme

STYLESHEET = Path(__file__).with_name("app.tcss")
_SPECS = json.loads(Path(__file__).with_name("themes.json").read_text(encoding="utf-8"))

DARK, LIGHT, HIGH_CONTRAST = THEMES = tuple(Theme(name=name, **spec) for name, spec in _SPECS.items())

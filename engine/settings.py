"""Generation settings: one dataclass that the CLI, the TUI and the bench fill in."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TREE = (1, 1, 1)  # measured best for the embedded default with its shipped SSMs (docs/performance.md)
DEFAULT_MERGE = "union"


@dataclass
class GenerationSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    tree_shape: tuple[int, ...] = DEFAULT_TREE  # children per node at each depth (SpecInfer's expansion config)
    speculate: bool = True  # False: incremental decoding, one token per verifier step (--no-spec)
    merge: str = DEFAULT_MERGE

    def __post_init__(self) -> None:
        self.tree_shape = tuple(self.tree_shape)
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("--temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("--top-p must be in (0, 1]")
        if not self.tree_shape or any(w < 1 for w in self.tree_shape) or len(self.tree_shape) > 16:
            raise ValueError("--tree must be 1 to 16 positive widths, e.g. 2,2,1,1")
        if self.merge not in ("union", "vote"):
            raise ValueError("--merge must be union or vote")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def parse_tree(text: str) -> tuple[int, ...]:
    """'2,2,1,1' -> (2, 2, 1, 1); ValueError with the reason otherwise."""
    try:
        shape = tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise ValueError(f"--tree {text!r}: expected comma-separated positive integers, e.g. 2,2,1,1") from None
    if not shape or any(w < 1 for w in shape) or len(shape) > 16:
        raise ValueError(f"--tree {text!r}: expected 1 to 16 positive integers, e.g. 2,2,1,1")
    return shape


def tree_text(shape: tuple[int, ...] = DEFAULT_TREE) -> str:
    """(2, 2, 1, 1) -> '2,2,1,1', the --tree spelling."""
    return ",".join(map(str, shape))

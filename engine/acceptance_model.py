"""AcceptanceModel: how likely the verifier is to accept a drafted token, learned online.

For a drafted node u whose parent was reached (the parent is the root or was accepted), let
A(u) be the event that the verifier accepts u. The model predicts

    a(u) = P(A(u) | parent reached)  from  (speculator, depth bucket, confidence bin, contested)

with a Beta-binomial estimate per cell: a = (hits + k * prior) / (trials + k). The confidence
of an SSM's node is its draft probability q (10 bins over [0, 1]); the n-gram drafter's is the
length of the suffix match that proposed it (a longer match repeats its source more often).
Priors are deliberately modest (prior mean 0.6 q for an SSM, 0.2 + 0.08 * match length for
n-gram, weight k = 4 trials) so a few steps of evidence dominate.

Contested: a sibling of u (another child of its parent) was proposed by a speculator that did not
propose u. Siblings are exclusive, at most one is accepted, and where two speculators disagree
each is right far less often than its confidence says alone: over 50 Vicuna and Spec-Bench
prompts (64 tokens, the shipped auto tree) the feature head's depth-1 drafts were accepted 50 %
of the time uncontested and 18 % contested, the n-gram drafter's 64 % and 21 %, and two children
from different speculators were predicted 1.04 tokens together where 0.57 came (docs/performance.md,
stop 45). So contested nodes have cells of their own, with half the prior. The n-gram drafter's two
matches contest each other too (TokenTree.mark_contested's rivals): its confidence, the match
length, does not say that another match disagrees, and with one cell for both its two-chain trees
were predicted 1.3-1.5x the tokens they gave and its lone chains 0.75-0.9x (stop 46).

Along a path the acceptances chain: the expected number of tokens a node contributes is

    v(u) = a(u) * v(parent(u)),  v(root) = 1

and a tree's expected accepted tokens are the sum of v over its drafted nodes (plus the bonus
token every step commits). A node several speculators proposed takes the best of their a.

Every verified step is folded in by `observe`; `calibration()` reports predicted against observed
acceptance per cell (the bench writes it to JSON).

What was learned outlives the process: `save` writes the cells to a JSON file the caller names
(the engine does after every answer), `load` reads them back with each cell's counts scaled down
to at most REMEMBERED trials, so a new process starts where the last one stopped (its first answer
drafts as well as its hundredth) while a few steps of a new topic still move every cell.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

DEPTH_BUCKETS = (1, 2, 3, 4, 6, 9)  # bucket b holds depths [DEPTH_BUCKETS[b], DEPTH_BUCKETS[b+1])
PROB_BINS = 10  # SSM confidence bins over q in [0, 1]
MAX_MATCH = 8  # n-gram confidence bins: match length 1..MAX_MATCH (longer clipped)
PRIOR_WEIGHT = 4.0
REMEMBERED = 64  # trials per cell a saved model keeps when read back
SAVE_VERSION = 2  # 2: cells keyed by contested too (a version 1 file's cells are read as uncontested)
CONTESTED_PRIOR = 0.5  # a contested cell's prior, relative to the uncontested one's


def acceptance_path(folder: Path, model: str, quant: str) -> Path:
    """Where a model's learned acceptance is kept: one file per verifier, quantisation and speculators."""
    return Path(folder) / f"acceptance-{hashlib.sha256(f'{model}|{quant}'.encode()).hexdigest()[:16]}.json"


def depth_bucket(depth: int) -> int:
    if 0 <= depth < len(_BUCKET_OF):
        return _BUCKET_OF[depth]
    return _bucket(depth)


def _bucket(depth: int) -> int:
    bucket = 0
    for b, start in enumerate(DEPTH_BUCKETS):
        if depth >= start:
            bucket = b
    return bucket


_BUCKET_OF = [_bucket(depth) for depth in range(65)]  # depth_bucket for the depths a tree has


def prob_bin(q: float) -> int:
    return min(int(q * PROB_BINS), PROB_BINS - 1)


def match_bin(length: int) -> int:
    return min(max(length, 1), MAX_MATCH)


@dataclass
class Cell:
    prior: float
    hits: float = 0.0
    trials: float = 0.0
    predicted_sum: float = 0.0  # sum of the predictions made for the trials observed in this process
    seen: int = 0  # trials observed in this process (the loaded ones were predicted by another)
    seen_hits: int = 0

    @property
    def mean(self) -> float:
        return (self.hits + PRIOR_WEIGHT * self.prior) / (self.trials + PRIOR_WEIGHT)


@dataclass
class AcceptanceModel:
    kinds: dict[str, str] = field(default_factory=dict)  # speculator -> "model" | "ngram"
    cells: dict[tuple[str, int, int, bool], Cell] = field(default_factory=dict)  # (speculator, depth bucket, bin, contested)
    _totals: dict[tuple[str, int], list[float]] = field(default_factory=dict, repr=False)  # (speculator, depth bucket) -> [hits, trials] over its cells

    def prior(self, speculator: str, conf_bin: int, contested: bool = False) -> float:
        scale = CONTESTED_PRIOR if contested else 1.0
        if self.kinds.get(speculator) == "ngram":
            return scale * (0.2 + 0.08 * conf_bin)  # match length 2: 0.36 ... 8: 0.84
        return scale * 0.6 * (conf_bin + 0.5) / PROB_BINS

    def cell(self, speculator: str, depth: int, conf_bin: int, contested: bool = False) -> Cell:
        key = (speculator, depth_bucket(depth), conf_bin, contested)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = Cell(self.prior(speculator, conf_bin, contested))
        return found

    def predict(self, evidence: dict, depth: int, contested: bool = False, names: list[str] | None = None,
                means: dict | None = None) -> float:
        """a(u) for a node with evidence {speculator: confidence bin} at `depth` (best over speculators).
        names: evidence keyed by speculator number instead (TokenTree.evidence), names[number] its name;
        means: a memo of cell means, for a caller that asks about many nodes while the model stands still
        (a step's tree choice: nothing is observed until the step is verified)."""
        best = 0.0
        for speculator, conf_bin in evidence.items():
            key = (speculator, depth, conf_bin, contested)
            a = None if means is None else means.get(key)
            if a is None:
                a = self.cell(speculator if names is None else names[speculator], depth, conf_bin, contested).mean
                if means is not None:
                    means[key] = a
            best = max(best, a)
        return best

    def observe(self, evidence: dict[str, int], depth: int, accepted: bool, contested: bool = False) -> None:
        for speculator, conf_bin in evidence.items():
            cell = self.cell(speculator, depth, conf_bin, contested)
            cell.predicted_sum += cell.mean
            cell.seen += 1
            cell.seen_hits += accepted
            cell.trials += 1
            cell.hits += accepted
            total = self._totals.setdefault((speculator, depth_bucket(depth)), [0.0, 0.0])
            total[0] += accepted
            total[1] += 1

    def mean_for(self, speculator: str, depth: int) -> float:
        """Observed acceptance of a speculator's nodes at this depth (all bins), its prior if unseen."""
        hits, trials = self._totals.get((speculator, depth_bucket(depth)), (0.0, 0.0))
        fallback = self.prior(speculator, PROB_BINS - 1 if self.kinds.get(speculator) != "ngram" else 0)
        return (hits + PRIOR_WEIGHT * fallback) / (trials + PRIOR_WEIGHT)

    def calibration(self) -> list[dict]:
        """Per cell observed in this process: speculator, depth bucket, confidence bin, trials, the mean
        prediction made before each of them, and how many were accepted (trials read back from a saved
        model were predicted by an earlier process, so they are not counted here)."""
        rows = []
        for (speculator, bucket, conf_bin, contested), cell in sorted(self.cells.items()):
            if cell.seen == 0:
                continue
            rows.append({
                "speculator": speculator,
                "depth_from": DEPTH_BUCKETS[bucket],
                "confidence": (f"q {conf_bin / PROB_BINS:.1f}-{(conf_bin + 1) / PROB_BINS:.1f}"
                               if self.kinds.get(speculator) != "ngram" else f"match {conf_bin}"),
                "contested": contested,
                "trials": cell.seen,
                "predicted": round(cell.predicted_sum / cell.seen, 4),
                "observed": round(cell.seen_hits / cell.seen, 4),
            })
        return rows

    # ------------------------------------------------------------------ persistence
    def save(self, path: Path) -> None:
        """The observed cells as JSON (written to a temp file and renamed)."""
        rows = [[s, b, c, x, cell.hits, cell.trials] for (s, b, c, x), cell in sorted(self.cells.items()) if cell.trials]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": SAVE_VERSION, "cells": rows}), encoding="utf-8")
        tmp.replace(path)

    def load(self, path: Path) -> bool:
        """Fold in the cells saved at `path` for this model's speculators (each at most REMEMBERED
        trials); False when there is no usable file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            version = data.get("version")
            if version not in (1, SAVE_VERSION):
                return False
            cells = data["cells"] if version == SAVE_VERSION else [[s, b, c, False, h, t] for s, b, c, h, t in data["cells"]]
            rows = [(str(s), int(b), int(c), bool(x), float(h), float(t)) for s, b, c, x, h, t in cells]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        for speculator, bucket, conf_bin, contested, hits, trials in rows:
            if speculator not in self.kinds or trials <= 0 or not 0 <= hits <= trials:
                continue
            scale = min(1.0, REMEMBERED / trials)
            cell = self.cells.setdefault((speculator, bucket, conf_bin, contested),
                                         Cell(self.prior(speculator, conf_bin, contested)))
            cell.hits, cell.trials = hits * scale, trials * scale
        self._totals.clear()  # mean_for's sums, over the cells as they now stand
        for (speculator, bucket, _, _), cell in self.cells.items():
            total = self._totals.setdefault((speculator, bucket), [0.0, 0.0])
            total[0] += cell.hits
            total[1] += cell.trials
        return True

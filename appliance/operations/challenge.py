"""Champion and challenger: a new version of a served model faces production on held-out data before it takes any
traffic.

Both versions label the validation examples of their dataset versions that neither trained on (a dataset that
grew is split anew, so one version's validation example may be in the other's training split): production's
data says whether the challenger forgot what production knows, the challenger's newer data (feedback a retrain
learnt from, say) whether it learnt what production does not. The challenger is held back, registered and
waiting for a person, only when it is both materially and significantly worse: more than
`Policy.challenge_max_drop` accuracy points, and McNemar's exact one-sided test on the examples where the two
disagree below `Policy.significance`. Otherwise it goes out as a canary, whose live feedback the autopilot judges
(operations.autopilot): on a few hundred examples a small difference is noise, and the canary is the real test.
Of more held-out examples than pipeline.GUARD_SAMPLE, a seeded random sample of that many is labelled: enough to
find a drop of a point, in a bounded pass whatever the size of the data.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from appliance import registry
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.store import Store, blobs
from appliance.train import runs


@dataclass(frozen=True)
class Challenge:
    """Production and the challenger on the same held-out examples."""

    production: str  # the versions' refs
    challenger: str
    datasets: list[str]  # the dataset versions the examples come from
    examples: int  # labelled: all those held out, or a sample of them
    production_accuracy: float
    challenger_accuracy: float
    only_production_right: int  # the examples where the two disagree, and which was right
    only_challenger_right: int
    p_worse: float  # McNemar's exact test: how likely so many only-production-right examples are by chance
    max_drop: float  # accuracy points
    significance: float
    held_out: int | None = None  # the examples held out, where more than were labelled

    @property
    def drop(self) -> float:
        return (self.production_accuracy - self.challenger_accuracy) * 100

    @property
    def holds(self) -> bool:
        """The challenger may take traffic: not both materially and significantly worse."""
        return not (self.drop > self.max_drop and self.p_worse < self.significance)

    @property
    def reason(self) -> str:
        if not self.examples:
            return (f"{self.challenger} and {self.production} trained on every validation example there is, so only "
                    "live feedback can compare them")
        labelled = (f"a sample of {self.examples:,} of the {self.held_out:,}" if self.held_out
                    else f"{self.examples:,}")
        scores = (f"{self.challenger_accuracy:.1%} against {self.production}'s {self.production_accuracy:.1%} on "
                  f"{labelled} held-out examples of {', '.join(self.datasets)}")
        if self.holds:
            return f"{self.challenger} holds up: {scores}"
        return (f"{self.challenger} is worse: {scores}, {self.drop:.1f} points down (at most {self.max_drop:g}"
                f" allowed), p = {self.p_worse:.2g}")

    def evidence(self) -> dict[str, Any]:
        return asdict(self) | {"holds": self.holds}


def challenge(store: Store, challenger: registry.ModelVersion, production: registry.ModelVersion,
              max_drop: float, significance: float) -> Challenge:
    """Score both versions, as they serve, on the validation examples of their data that neither trained on."""
    dataset_ids = dict.fromkeys(runs.get(store, version.run_id).dataset_id for version in (production, challenger))
    loaded = [datasets.load(store, datasets.get(store, dataset_id)) for dataset_id in dataset_ids]  # each once
    trained = {data.examples[i] for data in loaded for i in data.train}
    held_out = {data.examples[i]: data.labels[i] for data in loaded for i in data.validation
                if data.examples[i] not in trained}  # the challenger's (newer) label wins an example both hold
    examples = list(held_out)
    if len(examples) > pipeline.GUARD_SAMPLE:
        examples = random.Random(0).sample(examples, pipeline.GUARD_SAMPLE)
    labels = [held_out[example] for example in examples]
    production_right, challenger_right = (_right(store, version, examples, labels) for version in (production, challenger))
    only_production = sum(p and not c for p, c in zip(production_right, challenger_right))
    only_challenger = sum(c and not p for p, c in zip(production_right, challenger_right))
    return Challenge(
        production.ref, challenger.ref, sorted({data.version.ref for data in loaded}), len(examples),
        _share(production_right), _share(challenger_right), only_production, only_challenger,
        _binomial_tail(only_production, only_production + only_challenger), max_drop, significance,
        len(held_out) if len(held_out) > len(examples) else None)


def _right(store: Store, version: registry.ModelVersion, examples: list[str] | list[bytes], labels: list[str]
           ) -> list[bool]:
    if not examples:
        return []
    from appliance import inference  # openvino loads only for this step

    servable = inference.load_ir(blobs.read(store, version.serving_variant().blob_id))
    logits = inference.predict(servable.compiled, servable.reader, examples)
    return [servable.labels[int(row.argmax())] == label for row, label in zip(logits, labels)]


def _share(right: list[bool]) -> float:
    return sum(right) / len(right) if right else 0.0


def _binomial_tail(at_least: int, of: int) -> float:
    """P(X >= at_least) for X ~ Binomial(of, 1/2): 1.0 when there is no disagreement to count."""
    return sum(math.comb(of, k) for k in range(at_least, of + 1)) / 2**of

"""The live drift window: batches counted a chunk at a time come to what counting each one would, and a window
is scored when it fills."""

from __future__ import annotations

from appliance import inference
from appliance.serve import drift
from tests.conftest import Trained


def test_a_window_counts_what_it_was_served_and_scores_when_full(servable: inference.Servable,
                                                                   trained: Trained) -> None:
    sizes = [1, 1, 3, 32, 1, 7, 5, 1, 16, 2]  # lone texts and batches, as a server sees them
    texts, known = trained.data.texts[:sum(sizes)], trained.data.texts[sum(sizes):]
    labels = [servable.labels.index(label) for label in trained.data.labels[sum(sizes):]]
    reference = drift.reference(servable.reader, known, labels, inference.softmax(
        inference.predict(servable.compiled, servable.reader, known)))
    batches, start = [], 0
    for size in sizes:
        read = servable.reader.see(texts[start:start + size])
        logits = inference.predict(servable.compiled, servable.reader, texts[start:start + size])
        batches.append((read, inference.softmax(logits)))
        start += size

    one_by_one = reference.fresh()  # what each batch adds, counted on its own
    for read, probabilities in batches:
        one_by_one.add_inputs([read])
        one_by_one.add_outputs(probabilities)

    window = drift.Window(reference, size=sum(sizes))
    answers = [window.add(read, probabilities) for read, probabilities in batches]
    assert answers[:-1] == [None] * (len(sizes) - 1)  # not full until the last batch
    assert answers[-1] == one_by_one.scores(reference)
    assert window.counted.examples == 0  # a new window began

    bigger = drift.Window(reference, size=1000)
    assert all(bigger.add(read, probabilities) is None for read, probabilities in batches)
    counted_so_far = bigger.counted.examples
    assert counted_so_far >= drift.CHUNK and counted_so_far < sum(sizes)  # counted a chunk at a time
    for name, counts in bigger.counted.counts.items():
        assert counts.sum() <= one_by_one.counts[name].sum()

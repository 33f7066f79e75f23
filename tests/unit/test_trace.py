"""The trace format: one schema (engine/events.py) for the writer and the reader, with a version.

Written traces carry `"version"` and read back equal; traces from before the version field
(version 1) still read; a newer version, a wrong type or a missing field is refused with one line
that names the line and the field.
"""

from __future__ import annotations

import io
import json

import pytest

from spectui.engine.events import (
    TRACE_VERSION,
    ResidualToken,
    RunInfo,
    SampleTest,
    Sampling,
    StepEvent,
    TraceError,
    TreeNode,
    read_runs,
    read_trace,
    write_trace,
)


def step(n: int, tokens: list[int]) -> StepEvent:
    tree = [] if n == 0 else [
        TreeNode(0, -1, 0, 5, "a", [], None, None),
        TreeNode(1, 0, 1, tokens[0], "b", ["ngram"], 0.5, 0.9),
    ]
    return StepEvent(
        step=n, tree=tree, accepted=[1] if n else [], bonus_token=tokens[-1], bonus_text="c", new_tokens=tokens,
        new_text="bc", token_origins=["ngram", "verifier"][: len(tokens)], drafted=len(tree) - 1 if tree else 0,
        accepted_count=1 if n else 0, draft_ms=1, verify_ms=2.5, attention_backend="exact", speedup=1.5,
    )


def record(path, *runs) -> None:
    out = io.StringIO()
    for info, events in runs:
        list(write_trace(out, info, events))
    path.write_text(out.getvalue(), encoding="utf-8")


def test_written_trace_carries_the_version_and_reads_back_equal(tmp_path):
    trace = tmp_path / "t.jsonl"
    first = RunInfo(model="m", ssms=["ngram"], prompt="hi", tree_shape="auto")
    second = RunInfo(model="m", prompt="again", tree_shape=[2, 1], temperature=0.7)
    record(trace, (first, [step(0, [7]), step(1, [8, 9])]), (second, []))
    run_lines = [json.loads(line) for line in trace.read_text().splitlines() if '"kind": "run"' in line]
    assert [line["version"] for line in run_lines] == [TRACE_VERSION, TRACE_VERSION]
    runs = read_runs(trace)
    assert runs == [(first, [step(0, [7]), step(1, [8, 9])]), (second, [])]  # an empty turn stays a turn
    assert read_trace(trace) == (second, [step(0, [7]), step(1, [8, 9])])


def test_trace_without_version_is_version_1_and_reads(tmp_path):
    """A trace from before the version field, without the fields added since (they get their defaults)."""
    trace = tmp_path / "old.jsonl"
    event = json.loads(step(1, [8, 9]).to_json())
    for added in ("step_ms", "incremental_ms", "speedup"):
        del event[added]
    trace.write_text(json.dumps({"kind": "run", "model": "m", "tree_shape": [2, 2, 1, 1]}) + "\n" + json.dumps(event) + "\n")
    info, events = read_trace(trace)
    assert info.tree_shape == [2, 2, 1, 1] and info.merge == "union"
    assert events[0].new_tokens == [8, 9] and events[0].speedup is None and events[0].step_ms == 0.0


def sampled_step() -> StepEvent:
    event = step(1, [8, 9])
    event.sampling = Sampling(tests=[SampleTest(1, 0.25, 0.75, True)], bonus_node=1, removed_mass=0.0, bonus_prob=0.5,
                              residual_top=[ResidualToken(9, "c", 0.5), ResidualToken(4, "d", 0.25)])
    return event


def test_a_sampling_step_reads_back_equal(tmp_path):
    """Version 2's field: the sampling test's numbers (step mode), nested objects and all."""
    trace = tmp_path / "t.jsonl"
    record(trace, (RunInfo(model="m", temperature=0.8), [step(0, [7]), sampled_step()]))
    _, events = read_trace(trace)
    assert events == [step(0, [7]), sampled_step()] and events[1].sampling.tests[0].accepted is True
    assert events[0].sampling is None


def test_sampling_links_and_fields_are_checked():
    event = json.loads(sampled_step().to_json())
    event["sampling"]["tests"][0]["node"] = 0  # the root is never tested
    with pytest.raises(ValueError, match=r"field sampling.tests\[0\].node: node 0 is not a drafted node"):
        StepEvent.from_dict(event)
    event["sampling"]["tests"][0]["node"], event["sampling"]["bonus_node"] = 1, 2
    with pytest.raises(ValueError, match=r"field sampling.bonus_node: node 2 is not a node"):
        StepEvent.from_dict(event)
    event["sampling"]["bonus_node"], event["sampling"]["tests"][0]["draw"] = 1, "0.2"
    with pytest.raises(ValueError, match=r"field sampling.tests\[0\].draw: expected a number, got a string"):
        StepEvent.from_dict(event)


def test_numbers_written_as_integers_read_as_floats(tmp_path):
    trace = tmp_path / "t.jsonl"
    record(trace, (RunInfo(model="m"), [step(1, [8])]))
    (event,) = read_trace(trace)[1]
    assert isinstance(event.draft_ms, float) and event.draft_ms == 1.0


@pytest.mark.parametrize(
    "run, steps, message",
    [
        ({"version": TRACE_VERSION + 1}, [], f"line 1: field version: trace format {TRACE_VERSION + 1} is newer than this spectui reads ({TRACE_VERSION}): upgrade spectui"),
        ({"version": 0}, [], "line 1: field version: expected a positive integer, got 0"),
        ({"version": True}, [], "line 1: field version: expected a positive integer, got True"),
        ({"model": 3}, [], "line 1: field model: expected a string, got an integer"),
        ({"tree_shape": [1, "x"]}, [], "line 1: field tree_shape: expected a list of integers or a string, got a list"),
        ({"colour": "red"}, [], "line 1: field colour: unknown to this version of the trace format"),
        ({}, [{"new_tokens": "12"}], "line 2: field new_tokens: expected a list of integers, got a string"),
        ({}, [{"new_tokens": [1, True]}], "line 2: field new_tokens[1]: expected an integer, got a boolean"),
        ({}, [{}, {"finished": "yes"}], "line 3: field finished: expected a boolean, got a string"),
        ({}, [{"tree": [{"id": 0}]}], "line 2: field tree[0].parent: missing"),
        ({}, [{"tree": "none"}], "line 2: field tree: expected a list of objects, got a string"),
        ({}, [{"step": None}], "line 2: field step: expected an integer, got null"),
        ({}, [{"bonus_token": None, "speedup": "fast"}], "line 2: field speedup: expected a number or null, got a string"),
    ],
)
def test_fields_that_do_not_fit_name_line_and_field(tmp_path, run, steps, message):
    trace = tmp_path / "bad.jsonl"
    lines = [json.dumps({**json.loads(RunInfo(model="m").to_json()), **run})]
    lines += [json.dumps({**json.loads(step(1, [8, 9]).to_json()), **change}) for change in steps]
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as error:
        read_runs(trace)
    assert str(error.value).startswith(f"trace {trace}, {message}")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty"),
        ("\n\n", "is empty"),
        ('{"kind": "run", "model": "m"}\n\n{not json\n', "line 3: not JSON (Expecting property name"),
        ('[1, 2]\n', "line 1: expected a JSON object, got a list"),
        ('{"kind": "run", "model": "m"}\n{"step": 0}\n', 'line 2: field kind: expected "run" or "step", got null'),
        (step(0, [7]).to_json() + "\n", "line 1: a step before the run line"),
        ('{"kind": "run"}\n', "line 1: field model: missing"),
    ],
)
def test_malformed_files(tmp_path, text, message):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(text)
    with pytest.raises(TraceError) as error:
        read_runs(trace)
    assert message in str(error.value)


def test_tree_links_are_checked(tmp_path):
    event = json.loads(step(1, [8, 9]).to_json())
    event["tree"][1]["parent"] = 1  # a node that is its own parent would loop the tree view
    with pytest.raises(ValueError, match=r"field tree\[1\].parent: 1 is not an earlier node"):
        StepEvent.from_dict(event)
    event["tree"][1]["parent"], event["tree"][1]["id"] = 0, 4
    with pytest.raises(ValueError, match=r"field tree\[1\].id: expected 1"):
        StepEvent.from_dict(event)

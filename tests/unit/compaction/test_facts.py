"""The identifier extractor and the exact-fact guard's list (app/compaction/facts.py,
DESIGN.md §14): what counts as an identifier, what does not, the ranking, the bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.compaction.facts import (
    FACTS_HEADING,
    RECENT,
    facts_kept,
    guarded,
    identifier_set,
    identifiers,
    message_text,
    ranked,
)


def count(text: str) -> int:
    return len(text) // 4 + 1


POSITIVE = [
    (
        "open /testbed/astropy/modeling/separable.py now",
        "/testbed/astropy/modeling/separable.py",
        "path",
    ),
    ("edit src/app/main.py please", "src/app/main.py", "path"),
    ("see ~/.config/inflight/models.toml", "~/.config/inflight/models.toml", "path"),
    ("run ./scripts/build.sh", "./scripts/build.sh", "path"),
    (r"in C:\Users\dev\app.py it fails", r"C:\Users\dev\app.py", "path"),
    ("see https://github.com/a/b/issues/12.", "https://github.com/a/b/issues/12", "url"),
    ("(docs: http://localhost:8080/v1/models)", "http://localhost:8080/v1/models", "url"),
    ("commit 1a2b3c4d fixed it", "1a2b3c4d", "hash"),
    ("sha 9F8E7D6C5B", "9F8E7D6C5B", "hash"),
    ("at 0x7ffe1234 it crashed", "0x7ffe1234", "hash"),
    ("id 123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-426614174000", "uuid"),
    ("ticket ABC-123 is open", "ABC-123", "ticket"),
    ("ORA-00942: table missing", "ORA-00942", "ticket"),
    ("fixed in #4127", "#4127", "issue"),
    ("order #W2378156 shipped", "#W2378156", "issue"),
    ("order number 4127834 shipped", "4127834", "number"),
    ("took 250ms", "250ms", "quantity"),
    ("uses 3.5 GB of memory", "3.5 GB", "quantity"),
    ("expose 8080/tcp", "8080/tcp", "quantity"),
    ("costs $129.50 total", "$129.50", "quantity"),
    ("CPU at 93%", "93%", "quantity"),
    ("wait 30 seconds", "30 seconds", "quantity"),
    ("upgrade to 2.4.1 today", "2.4.1", "version"),
    ("tag v1.0.0-rc.1 cut", "v1.0.0-rc.1", "version"),
    ("failed with ENOENT", "ENOENT", "error"),
    ("ECONNREFUSED on connect", "ECONNREFUSED", "error"),
    ("rustc says E0425", "E0425", "error"),
    ("got HTTP 404 back", "HTTP 404", "error"),
    ("tsc: TS2345 here", "TS2345", "error"),
    ("raised ValueError", "ValueError", "exception"),
    ("a KeyError in the loop", "KeyError", "exception"),
    ("json.decoder.JSONDecodeError: bad", "json.decoder.JSONDecodeError", "exception"),
    ("StopIteration escaped", "StopIteration", "exception"),
    ("call parse_config() first", "parse_config", "call"),
    ("os.path.join(a, b)", "os.path.join", "call"),
    ("the separability_matrix helper", "separability_matrix", "snake"),
    ("define __init__ there", "__init__", "snake"),
    ("class CompoundModel is", "CompoundModel", "camel"),
    ("use getUserById to", "getUserById", "camel"),
    ("module astropy.modeling.core holds", "astropy.modeling.core", "dotted"),
    ('the name "Mia Garcia" booked', "Mia Garcia", "quoted"),
    ("run `make test` again", "make test", "quoted"),
    ("the flag 'fast mode' is on", "fast mode", "quoted"),
    ('{"user_id": "mia_garcia_4516"}', "mia_garcia_4516", "quoted"),
]


@pytest.mark.parametrize(("text", "expected", "kind"), POSITIVE)
def test_each_kind_of_identifier_is_found_verbatim(text: str, expected: str, kind: str) -> None:
    found = {(i.text, i.kind) for i in identifiers(text)}
    assert (expected, kind) in found


NEGATIVE = [
    "The quick brown fox jumps over the lazy dog.",
    "and/or 1/2 km/h I/O",
    "UTF-8 and SHA-256 and ISO-8601 and GPT-4",
    "e.g. this, i.e. that, etc.",
    "don't worry, it's fine",
    "Hello World, OK, USA",
    "the year 2024 and 12 apples",
    "Error and Exception alone",
    "print(x) and len(y)",
    "a / b // c",
    "version 3.5",
    "decade facade",
]


@pytest.mark.parametrize("text", NEGATIVE)
def test_prose_and_near_misses_are_not_identifiers(text: str) -> None:
    assert identifiers(text) == []


def test_a_json_key_is_not_a_quoted_identifier_but_its_value_is() -> None:
    found = {(i.text, i.kind) for i in identifiers('{"reservation_id": "ZFA04Y", "n": 1}')}
    assert ("ZFA04Y", "quoted") in found
    assert not any(kind == "quoted" and text == "reservation_id" for text, kind in found)


def test_a_url_wins_over_the_path_inside_it_and_trailing_punctuation_is_dropped() -> None:
    assert [i.text for i in identifiers("see (https://x.test/a/b.py).")] == [
        "https://x.test/a/b.py"
    ]


def test_json_escapes_do_not_glue_onto_the_next_identifier() -> None:
    assert identifier_set(r'{"cmd": "x\ninitial_state.add_model()\n"}') >= {
        "initial_state.add_model"
    }
    assert "ninitial_state.add_model" not in identifier_set(r"x\ninitial_state.add_model()")


def test_quoted_strings_are_bounded() -> None:
    long = "a" * 81
    assert identifiers(f'"{long}"') == []
    assert identifiers('"a"') == []


def test_message_text_covers_content_parts_and_calls() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "look at /etc/hosts"}],
        "tool_calls": [{"function": {"name": "read_file", "arguments": '{"p": "a/b.py"}'}}],
    }
    assert identifier_set(message_text(message)) >= {"/etc/hosts", "read_file", "a/b.py"}


def test_ranking_puts_identifiers_of_several_messages_first_then_the_most_recent() -> None:
    texts = ["alpha_one beta_two", "gamma_three", "beta_two delta_four", "epsilon_five"]
    assert ranked(texts) == ["beta_two", "epsilon_five", "delta_four", "gamma_three", "alpha_one"]


SPAN = [
    {"role": "user", "content": "Fix ENOENT in /srv/app/config.yaml for order #W2378156"},
    {"role": "assistant", "content": "Reading /srv/app/config.yaml; see parse_config()."},
    {"role": "tool", "content": "KeyError: 'db_url' at src/app/settings.py:12"},
]


def test_the_guard_lists_what_the_summary_lost_and_nothing_it_kept() -> None:
    block = facts_kept(SPAN, "The user fixes ENOENT in a config file.", 1000, count)
    assert block.startswith(FACTS_HEADING)
    for kept in ("/srv/app/config.yaml", "#W2378156", "parse_config", "KeyError", "db_url"):
        assert kept in block
    assert "ENOENT" not in block  # the summary has it verbatim


def test_the_guard_adds_nothing_when_nothing_was_lost() -> None:
    everything = " ".join(sorted(identifier_set(" ".join(message_text(m) for m in SPAN))))
    assert facts_kept(SPAN, everything, 1000, count) == ""
    assert guarded("all kept: " + everything, SPAN, 1000, count) == "all kept: " + everything


def test_the_guard_never_changes_the_summary_and_stays_within_its_bound() -> None:
    summary = "A short summary."
    for bound in (0, 5, 12, 20, 40, 1000):
        text = guarded(summary, SPAN, bound, count)
        assert text.startswith(summary)
        assert text == summary or count(text) <= bound + 2


TOKENS = st.text(alphabet="abcdef0123456789_./#-: \"'`ENOTXYZ", max_size=400)


@settings(max_examples=80, deadline=None)
@given(spans=st.lists(TOKENS, min_size=1, max_size=6), summary=TOKENS, bound=st.integers(0, 300))
def test_the_guard_is_a_bounded_pure_function_of_span_and_summary(
    spans: list[str], summary: str, bound: int
) -> None:
    span = [{"role": "user", "content": text} for text in spans]
    once = guarded(summary, span, bound, count)
    assert once == guarded(summary, [dict(m) for m in span], bound, count)  # deterministic
    assert once.startswith(summary)
    if once != summary:
        assert count(once) <= bound
        listed = once[len(summary) :].removeprefix("\n\n" + FACTS_HEADING + " ")
        for ident in listed.split(" ; "):
            assert ident not in summary  # only what the summary lost
            assert any(ident in text for text in spans)  # verbatim from the span


def test_ranking_puts_the_last_texts_identifiers_before_older_repeated_ones() -> None:
    old = ["old_twice", "old_twice"]
    recent = [f"filler{i}" for i in range(RECENT - 1)] + ["fresh_once"]
    order = ranked(old + recent)
    assert order.index("fresh_once") < order.index("old_twice")
    assert order[0] == "fresh_once"  # the most recent first among the once-mentioned


def test_the_guard_leaves_out_what_the_prompts_fixed_head_holds() -> None:
    head = "System: you work on /srv/app/config.yaml"
    block = facts_kept(SPAN, "A summary.", 1000, count, head)
    assert "/srv/app/config.yaml" not in block
    assert "parse_config" in block
    assert guarded("A summary.", SPAN, 1000, count, head).endswith(block)

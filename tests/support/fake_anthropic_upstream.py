"""Anthropic's rules for `tests/unit/apis/anthropic/test_anthropic_format.py` alone, until its
import moves to `tests.support.fakes.anthropic` (where the rules and the fake now live); delete
this module then."""

from tests.support.fakes.anthropic import all_blocks, rule_violations

__all__ = ["all_blocks", "rule_violations"]

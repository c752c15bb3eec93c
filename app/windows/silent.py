"""Silent truncation: an upstream that cut a too-long prompt and answered 200 (DESIGN.md §11).

Some servers (Ollama) drop the start of a prompt longer than their window without an error; the only
trace is the usage they report: far fewer prompt tokens than were sent.
"""

from __future__ import annotations

import logging

from inflight.settings import redact_url
from inflight.windows.registry import WindowRegistry

logger = logging.getLogger(__name__)
SILENT_SHARE = 0.70  # reported < this share of the estimate: the upstream did not see it all


def silently_truncated(
    reported: int | None, estimate: int, window: int, trusted: bool = False
) -> bool:
    """Whether an upstream that counted `reported` prompt tokens of a prompt estimated at
    `estimate` tokens, for a window of `window`, must have cut it; `trusted`: the estimate is
    exact or calibrated on this model's earlier answers.

    Prompt caching cannot explain a shortfall — cached tokens are part of the reported prompt
    (OpenAI's `prompt_tokens`, the Responses API's `input_tokens`, Anthropic's input plus cache
    reads and writes) — but an estimate can be off, so a shortfall only counts when the estimate is
    over the window the proxy knows (a prompt that should not have fitted, and evidently did not),
    or when the estimate can be trusted: the model's tokenizer is exact, or the counter has
    calibrated on this model's earlier answers. That second case is the one Ollama users meet: the
    table (or discovery) says 128k, the server runs a 2k–8k `num_ctx`, the conversation grows past
    it, and only the reported count stops growing — a trusted estimate 30 % over it is no counting
    error.
    """
    if reported is None or reported <= 0 or (estimate <= window and not trusted):
        return False
    return reported < SILENT_SHARE * estimate


def learn_silent_cut(
    windows: WindowRegistry,
    base_url: str,
    model: str,
    reported: int | None,
    sent: tuple[int, int],
    trusted: bool = False,
    client: str = "",
) -> bool:
    """Whether the upstream at `base_url` cut a prompt of `model` silently, by the `reported`
    prompt tokens and what was `sent` (the estimate of its measured part — without guessed
    parts —, the window assumed). If so, the window it evidently holds is learned for `client`
    — never a larger one than assumed — and a WARNING says so, without any content.

    The estimate compared is the measured part only: images, documents, files and audio are sized by
    a guess (a PDF billed at a quarter of it is no cut), so they count as nothing here. What one
    client saw is its own window until others saw it too (app/windows/registry.py).
    """
    estimate, window = sent
    if reported is None or not silently_truncated(reported, estimate, window, trusted):
        return False
    if reported < window:
        windows.learn_silent(base_url, model, reported, client)
    logger.warning(
        "upstream %s silently truncated a prompt of %s: it counted %d tokens of the ~%d sent "
        "(window assumed: %d tokens); now assuming a window of %d for this client",
        redact_url(base_url), model, reported, estimate, window, min(reported, window),
    )  # fmt: skip
    return True

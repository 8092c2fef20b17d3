"""`OpenAIBackend`: regeneration by any OpenAI-compatible server (vLLM, SGLang, ...).

Built on the `openai` client library: its retries (with backoff, on 408 / 409 / 429 / 5xx and
connection errors) and timeouts, and `extra_body` for what the OpenAI schema lacks but vLLM /
SGLang accept (`top_k`, `chat_template_kwargs`). A server's `reasoning_content` (or
`reasoning`, newer vLLM) is kept on request (`keep_reasoning`): the assistant message then
carries it as `reasoning_content`, the field chat templates such as Qwen3's read.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dspark.data.regeneration.sampling import GenerationFailed, Reply, SamplingConfig


class OpenAIBackend:
    """`POST {url}/v1/chat/completions` per conversation, the requests of a call concurrently.

    Each request carries `seed = row_seed(...)`, so a server that honours `seed` reproduces
    rows on a rerun. A request that still fails after the retries gives a `GenerationFailed`
    for its row only.
    """

    name = "server"

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        retries: int = 2,
        chat_template_kwargs: dict | None = None,
        max_workers: int = 8,
        keep_reasoning: bool = False,
    ):
        try:
            import openai  # optional: openai
        except ImportError as e:  # pragma: no cover - a dependency of dspark
            raise ImportError(
                "the server backend needs the `openai` package: pip install openai"
            ) from e
        self._openai = openai
        base = url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        # local servers usually need no key, but the client insists on one
        self.client = openai.OpenAI(
            base_url=base, api_key=key or "EMPTY", timeout=timeout, max_retries=retries
        )
        self.base = base
        self.kw = chat_template_kwargs or {}
        self.max_workers = max_workers
        self.keep_reasoning = keep_reasoning
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        try:
            return self.client.models.list().data[0].id
        except Exception as e:
            raise GenerationFailed(
                f"cannot list models at {self.base}/models ({type(e).__name__}: {e}); "
                "pass --server-model"
            ) from e

    def _one(self, conv, seed: int, s: SamplingConfig) -> Reply | GenerationFailed:
        openai = self._openai
        extra: dict[str, Any] = {}
        if s.top_k and s.top_k > 0:
            extra["top_k"] = s.top_k
        if self.kw:
            extra["chat_template_kwargs"] = self.kw
        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                messages=conv,
                max_tokens=s.max_new_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                seed=seed,
                n=1,
                extra_body=extra or None,
            )
        except openai.APIStatusError as e:
            return GenerationFailed(f"HTTP {e.status_code} from server: {str(e)[:300]}")
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            return GenerationFailed(f"server unreachable: {type(e).__name__}: {e}")
        try:
            choice = resp.choices[0]
            msg = choice.message
            text = msg.content
        except (AttributeError, IndexError, TypeError) as e:
            return GenerationFailed(f"bad server response: {e}: {resp!r:.200}")
        if not isinstance(text, str):
            return GenerationFailed(f"server returned no text content: {choice!r:.200}")
        reasoning = None
        if self.keep_reasoning:
            extra_fields = getattr(msg, "model_extra", None) or {}
            for field in ("reasoning_content", "reasoning"):
                reasoning = reasoning or getattr(msg, field, None) or extra_fields.get(field)
            if not isinstance(reasoning, str):
                reasoning = None
        tokens = getattr(resp.usage, "completion_tokens", None) or 0
        finish = "length" if choice.finish_reason == "length" else "stop"
        return Reply(text, int(tokens), finish, reasoning=reasoning)

    def generate(self, convs, seeds, sampling: SamplingConfig):
        workers = max(1, min(self.max_workers, len(convs)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda a: self._one(a[0], a[1], sampling), zip(convs, seeds)))

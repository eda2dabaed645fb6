"""The lm-evaluation-harness model ``gptlab``: ``lm_eval --model gptlab --model_args pretrained=CKPT``.

lm-eval asks three things of a model, all answered by ``gptlab.evaluate.scoring`` and ``gptlab.generate``:

    loglikelihood(context, continuation)   log p(y | x) = Σ_t log softmax(l_{n+t-1})_{y_t}, and greedy(y | x)
    loglikelihood_rolling(text)            Σ over disjoint windows of at most max_length predicted tokens,
                                           the first conditioned on the prefix token (BOS, else EOS)
    generate_until(context, until)         greedy decoding, stopped at the stop strings and stop tokens

Texts are split into tokens as lm-eval's Hugging Face backend does (``TemplateLM._encode_pair``: the
whole ``x ⧺ y`` is encoded, and the context's own encoding marks where ``y`` starts; no special tokens
are added, special tokens written in the text are matched), so the figures equal that backend's.
``--apply_chat_template`` renders the model's own chat template (``gptlab.tokenizers.chat``).

``import gptlab.evaluate.harness`` registers the name (``gptlab eval --tasks`` imports it); lm-eval's own
``lm_eval --model gptlab`` finds it through the start-up hook installed with gptlab (``gptlab_lmeval_hook``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from gptlab.errors import GptlabError
from gptlab.evaluate.opening import open_model
from gptlab.evaluate.scoring import Score, loglikelihoods, rolling_windows
from gptlab.generate import SampleConfig, generate_batch
from gptlab.tokenizers.chat import stop_ids, template_for
from gptlab.tokenizers.pretrained import encode_text

CHUNK = 64  # requests scored per call (one progress-bar step)
GEN_ROWS = 16  # generate_until: prompts decoded together at least


@register_model("gptlab")
class GptlabLM(TemplateLM):
    """A gptlab model for lm-eval: any checkpoint ``gptlab`` opens (``pretrained=``), in ``dtype`` on ``device``."""

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, object] | None = None
    ) -> GptlabLM:
        """``--model_args`` plus lm-eval's own settings (``--device``, ``--batch_size``); a setting given
        in both is taken from ``--model_args`` (lm-eval's base class passes it twice and fails)."""
        from lm_eval.utils import simple_parse_args_string

        given = simple_parse_args_string(arg_string)
        extra: dict[str, Any] = {
            k: v for k, v in (additional_config or {}).items() if v is not None and k not in given
        }
        return cls(**given, **extra)

    def __init__(
        self,
        pretrained: str,
        dtype: str = "fp32",
        device: str | None = None,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool = False,
        batch_tokens: int = 4096,
    ) -> None:
        super().__init__()
        from gptlab.hardware import resolve_device

        try:
            device = resolve_device(device or "auto")
        except GptlabError as exc:  # lm_eval's --device defaults to cuda:0: fall back as its HF backend does
            warnings.warn(f"{exc}; using device=auto", stacklevel=2)
            device = resolve_device("auto")
        self.model, self.tokenizer = open_model(str(pretrained), str(dtype), device)
        self.name = str(pretrained)
        self._device = device
        block = self.model.config.block_size
        self._max_length = min(int(max_length), block) if max_length else block
        self._max_gen_toks = int(max_gen_toks)
        # rows decoded together by generate_until (each row's text equals its own generation, so this is speed
        # only): lm-eval's batch_size when larger, else GEN_ROWS (its command line's default batch_size is 1)
        self.batch_rows = max(GEN_ROWS, int(str(batch_size)) if str(batch_size).isdigit() else 0)
        self.add_bos_token = bool(add_bos_token)
        self.batch_tokens = int(batch_tokens)
        self.template = template_for(self.tokenizer)

    # ------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        eot = self.tokenizer.eot_id
        if eot is None:
            raise GptlabError(f"{self.name}: the tokenizer has no end-of-text token, which lm-eval needs")
        return eot

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the first rolling window start from: BOS if the model has one, else EOS."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **_: object,
    ) -> list[int]:
        """Token ids of ``string``, special tokens matched, BOS first only with ``add_bos_token``."""
        ids = encode_text(self.tokenizer, string, bool(add_special_tokens or self.add_bos_token))
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # ------------------------------------------------------------ chat
    @property
    def tokenizer_name(self) -> str:
        return f"gptlab:{self.name}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.template.source

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.template.render(chat_history, add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------ scoring
    def _scores(self, pairs: list[tuple[list[int], list[int]]], desc: str, disable_tqdm: bool) -> list[Score]:
        out: list[Score] = []
        with tqdm(total=len(pairs), desc=desc, disable=disable_tqdm) as bar:
            for start in range(0, len(pairs), CHUNK):
                chunk = pairs[start : start + CHUNK]
                out += loglikelihoods(
                    self.model, chunk, batch_tokens=self.batch_tokens, max_len=self.max_length
                )
                bar.update(len(chunk))
        return out

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **_: object,
    ) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        scores = self._scores(pairs, "Running loglikelihood requests", disable_tqdm)
        out = []
        for (key, _ctx, _cont), score in zip(requests, scores, strict=True):
            answer = (score.logprob, score.greedy)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for i, req in enumerate(requests):
            for window in rolling_windows(
                self.tok_encode(req.args[0]), self.prefix_token_id, self.max_length
            ):
                windows.append(window)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, score in zip(
            owner, self._scores(windows, "Running loglikelihood_rolling", disable_tqdm), strict=True
        ):
            totals[i] += score.logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    # ------------------------------------------------------------ generation
    def _sample_config(self, gen_kwargs: dict) -> tuple[SampleConfig, list[str]]:
        kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=self.tok_decode([self.eot_token_id]))
        temperature = float(kwargs.pop("temperature", 0.0)) if kwargs.pop("do_sample", False) else 0.0
        config = SampleConfig(
            max_new_tokens=int(kwargs.pop("max_gen_toks")),
            temperature=temperature,
            top_p=kwargs.pop("top_p", None),
            top_k=kwargs.pop("top_k", None),
            stop=[s for s in until if s],
            stop_tokens=stop_ids(self.tokenizer),
            seed=1234,
            slide=False,
        )
        return config, until

    def _prompt(self, context: str, room: int) -> str:
        """``context``, or the text of its last ``room`` tokens when it is longer (lm-eval's left truncation)."""
        ids = self.tok_encode(context)
        return context if len(ids) <= room else self.tok_decode(ids[-room:])

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):  # requests with the same generation settings decode together
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        with tqdm(total=len(requests), desc="Running generate_until requests", disable=disable_tqdm) as bar:
            for members in groups.values():
                config, until = self._sample_config(requests[members[0]].args[1])
                room = self.max_length - config.max_new_tokens
                if room < 1:
                    raise GptlabError(
                        f"max_gen_toks={config.max_new_tokens} leaves no room for a prompt in the context of "
                        f"{self.max_length} tokens"
                    )
                for start in range(0, len(members), self.batch_rows):
                    rows = members[start : start + self.batch_rows]
                    prompts = [self._prompt(requests[i].args[0], room) for i in rows]
                    for i, text in zip(
                        rows, generate_batch(self.model, self.tokenizer, prompts, config), strict=True
                    ):
                        out[i] = postprocess_generated_text(text, until, None)
                        self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
                    bar.update(len(rows))
        return [text or "" for text in out]

"""The model zoo: Hugging Face transformers models and torch.nn models under minijit.jit, equal to eager.

Each model is built from a tiny config with random weights (no download, HF_HUB_OFFLINE=1),
copied, and run eagerly and jitted on the same inputs in training mode (dropout included: the
same seed before each call gives the same draws): every tensor of the output (logits, loss,
hidden states, the returned key/value cache), every parameter's gradient and every buffer equal
eager's, for a first call (a trace) and a second call with new inputs of the same shapes (a
cache hit; for models whose first call changes the model, a third call). Text models run without and with
an `attention_mask` that pads one sequence.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: every model is built from a config

import transformers
from transformers import AutoConfig

import minijit

RTOL, ATOL = 1e-4, 1e-5
BATCH, SEQ, VOCAB = 2, 16, 128
_TOKENS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# A decoder-only transformer: hidden 32, 2 layers, 4 query heads sharing 2 key/value heads.
_DECODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64, **_TOKENS}
_ENCODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "max_position_embeddings": 64, **_TOKENS}


def _hf(auto: str, model_type: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return getattr(transformers, auto).from_config(AutoConfig.for_model(model_type, **config))

    return build


def _audio(model_type: str, **config: Any) -> Callable[[], nn.Module]:
    """A CTC speech model's logits and a loss on them (its own CTC loss first checks `labels.max()`, a branch on
    data, which a trace cannot take); LayerDrop off (it branches on a random draw)."""
    build = _hf("AutoModelForCTC", model_type, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 8),
                num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, vocab_size=24, mask_time_prob=0.0,
                layerdrop=0.0, **config)
    return lambda: WithLoss(build(), lambda body, **inputs: body(**inputs).logits)


# name -> (builder, kind of inputs)
HF_MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "llama": (_hf("AutoModelForCausalLM", "llama", **_DECODER), "causal"),
    "mistral": (_hf("AutoModelForCausalLM", "mistral", **_DECODER, sliding_window=8), "causal"),
    "qwen2": (_hf("AutoModelForCausalLM", "qwen2", **_DECODER), "causal"),
    "gemma2": (_hf("AutoModelForCausalLM", "gemma2", **_DECODER, head_dim=8, query_pre_attn_scalar=8,
                   sliding_window=8), "causal"),
    "phi3": (_hf("AutoModelForCausalLM", "phi3", **_DECODER), "causal"),
    # The default experts implementation ("grouped_mm"), traced in float32, calls transformers' custom op
    # `transformers::grouped_mm_fallback` (torch.library): one opaque torch op (minijit/ops/opaque.py).
    "mixtral": (_hf("AutoModelForCausalLM", "mixtral", **_DECODER, num_local_experts=4, num_experts_per_tok=2,
                    output_router_logits=True), "causal"),
    "gpt2": (_hf("AutoModelForCausalLM", "gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64, **_TOKENS),
             "causal"),
    "gpt_neox": (_hf("AutoModelForCausalLM", "gpt_neox", **{**_ENCODER, "num_key_value_heads": 4}), "causal"),
    "opt": (_hf("AutoModelForCausalLM", "opt", hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                word_embed_proj_dim=32, max_position_embeddings=64, **_TOKENS), "causal"),
    "falcon": (_hf("AutoModelForCausalLM", "falcon", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   **_TOKENS), "causal"),
    "bert": (_hf("AutoModelForMaskedLM", "bert", **_ENCODER), "masked"),
    "roberta": (_hf("AutoModelForMaskedLM", "roberta", **{**_ENCODER, "max_position_embeddings": 66, "pad_token_id": 1}),
                "masked"),
    "t5": (_hf("AutoModelForSeq2SeqLM", "t5", d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
               decoder_start_token_id=0, **_TOKENS), "seq2seq"),
    "bart": (_hf("AutoModelForSeq2SeqLM", "bart", d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 max_position_embeddings=64, decoder_start_token_id=2, **_TOKENS), "seq2seq"),
    "vit": (_hf("AutoModelForImageClassification", "vit", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, image_size=16, patch_size=4, num_labels=3), "image"),
    # Its selective scan calls torch's associative_scan (transformers takes that path when
    # torch.compiler.is_compiling() is True, as it is while minijit traces): minijit/frontend/scan.py.
    "mamba": (_hf("AutoModelForCausalLM", "mamba", hidden_size=16, state_size=4, num_hidden_layers=1, expand=2,
                  conv_kernel=4, **_TOKENS), "recurrent"),
    # The feature encoder sets `requires_grad = True` on a view of its input in training.
    "hubert": (_audio("hubert"), "audio"),
    "sew": (_audio("sew", squeeze_factor=2), "audio"),
    # Its chunked attention computes chunk counts with torch.div on Python ints and branches on the mask's values
    # (`is_global_attn = ....any().item()`): folded numbers and a value guard (minijit/runtime/values.py).
    "longformer": (_hf("AutoModelForMaskedLM", "longformer", **{**_ENCODER, "num_hidden_layers": 1,
                                                                 "max_position_embeddings": 66, "pad_token_id": 1},
                       attention_window=4), "masked"),
    "resnet": (_hf("AutoModelForImageClassification", "resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                   layer_type="basic", num_labels=3), "image"),
}
# Models whose first call changes the model itself, as eagerly (the jitted call replays it): the second call
# re-traces, for the reason given, and the third is a cache hit.
FIRST_CALL_CHANGES = {
    "mixtral": "forward hook added",  # router logits are collected by hooks transformers installs on first use
    "vit": "attribute problem_type = None changed",  # the classification loss sets config.problem_type
    "resnet": "attribute problem_type = None changed",
}


def _text_inputs(kind: str, masked: bool) -> dict[str, Any]:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    labels = ids.clone()
    inputs: dict[str, Any] = {"input_ids": ids, "labels": labels}
    if masked:
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if kind == "causal":
            mask[1, :5] = 0  # left padding, as for generation
        else:
            mask[1, -5:] = 0
        ids[mask == 0] = 0
        labels[mask == 0] = -100  # padded positions are not scored
        inputs["attention_mask"] = mask
    return inputs


def _image_inputs() -> dict[str, Any]:
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16), "labels": torch.randint(0, 3, (BATCH,))}


def _audio_inputs() -> dict[str, Any]:
    return {"input_values": torch.randn(BATCH, 400)}


def tensors_in(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a model's output, in order: ModelOutput fields, tuples, and objects such as a KV cache."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 8 or value is None or isinstance(value, int | float | str | bool | nn.Module):
        return []
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v, depth + 1)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v, depth + 1)]
    own = getattr(value, "__dict__", None)
    return [t for v in own.values() for t in tensors_in(v, depth + 1)] if isinstance(own, dict) else []


def _close(have: Any, want: Any, what: str) -> None:
    torch.testing.assert_close(have, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _loss(output: Any) -> torch.Tensor:
    return output["loss"] if isinstance(output, dict) else output.loss


def run_against_eager(eager: nn.Module, make_inputs: Callable[[], dict[str, Any]], calls: int
                      ) -> minijit.JitModule:
    """Call `eager` and a jitted deep copy `calls` times on the same inputs (same seed before each call):
    output tensors, the gradients of the output's `loss` and the buffers equal eager's after every call."""
    jitted = copy.deepcopy(eager)
    jm = minijit.jit(jitted)
    for call in range(calls):
        inputs = make_inputs()
        torch.manual_seed(call)
        want = eager(**inputs)
        torch.manual_seed(call)
        have = jm(**inputs)
        assert type(have) is type(want)
        want_tensors, have_tensors = tensors_in(want), tensors_in(have)
        assert len(have_tensors) == len(want_tensors), f"call {call}: {len(have_tensors)} output tensors, not " \
                                                      f"{len(want_tensors)}"
        for i, (h, w) in enumerate(zip(have_tensors, want_tensors)):
            _close(h, w, f"call {call}: output tensor {i}")
        _loss(want).backward()
        _loss(have).backward()
        for (name, p), (_, q) in zip(eager.named_parameters(), jitted.named_parameters(), strict=True):
            if p.grad is None:
                assert q.grad is None, f"call {call}: {name} got a gradient eager did not"
            else:
                _close(q.grad, p.grad, f"call {call}: grad of {name}")
        for (name, b), (_, c) in zip(eager.named_buffers(), jitted.named_buffers(), strict=True):
            _close(c, b, f"call {call}: buffer {name}")
        eager.zero_grad()
        jitted.zero_grad()
    return jm


# Kinds of inputs run without a padding mask: images, speech, and recurrent models (Mamba), which take none.
UNMASKED = {"image", "audio", "recurrent"}
HF_CASES = [(name, masked) for name, (_, kind) in HF_MODELS.items() for masked in
            ((False, True) if kind not in UNMASKED else (False,))]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "masked"), HF_CASES, ids=[f"{n}-{'mask' if m else 'nomask'}" for n, m in HF_CASES])
def test_hugging_face_model_matches_eager(name: str, masked: bool) -> None:
    build, kind = HF_MODELS[name]
    torch.manual_seed(0)
    model = build().train()
    make = {"image": _image_inputs, "audio": _audio_inputs}.get(kind, lambda: _text_inputs(kind, masked))
    jm = run_against_eager(model, make, calls=3)
    info = minijit.cache_info(jm)
    if name in FIRST_CALL_CHANGES:
        assert (info.misses, info.hits) == (2, 1) and FIRST_CALL_CHANGES[name] in info.miss_reasons[1], str(info)
    else:
        assert (info.misses, info.hits) == (1, 2), str(info)


# -- torch.nn models (tests/models/test_nn_layers.py covers the single layers and a hand-written ResNet) --------


class WithLoss(nn.Module):
    """A torch.nn model and a loss on its output, returned together as a dict (as a ModelOutput would be)."""

    def __init__(self, body: nn.Module, call: Callable[..., Any]):
        super().__init__()
        self.body = body
        self.call = call

    def forward(self, **inputs: Any) -> dict[str, Any]:
        out = self.call(self.body, **inputs)
        first = out[0] if isinstance(out, tuple) else out
        return {"out": out, "loss": first.square().mean()}


class LstmLanguageModel(nn.Module):
    """Embedding, a 2-layer LSTM with dropout between its layers, a tied head, cross entropy on the next token."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32, padding_idx=0)
        self.lstm = nn.LSTM(32, 32, num_layers=2, dropout=0.1, batch_first=True)
        self.head = nn.Linear(32, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids, labels, attention_mask=None):
        hidden, (h, c) = self.lstm(self.embed(input_ids))
        if attention_mask is not None:
            hidden = hidden * attention_mask.unsqueeze(-1)
        logits = self.head(hidden)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return {"logits": logits, "state": (h, c), "loss": loss}


def _sequence(masked: bool, what: str) -> dict[str, Any]:
    """A batch of vectors (`x`), and where masked a padding mask (True at the padded positions of sequence 1)."""
    inputs: dict[str, Any] = {"x": torch.randn(BATCH, SEQ, 32)}
    if masked:
        pad = torch.zeros(BATCH, SEQ, dtype=torch.bool)
        pad[1, -5:] = True
        inputs[what] = pad
    return inputs


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)  # dropout 0.1
    return WithLoss(nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32), enable_nested_tensor=False),
                    lambda body, x, **masks: body(x, **masks))


def _attention() -> nn.Module:
    return WithLoss(nn.MultiheadAttention(32, 4, dropout=0.1, batch_first=True, kdim=24, vdim=24),
                    lambda body, x, **masks: body(x, x[..., :24] * 2, x[..., 8:], **masks))


def _causal() -> dict[str, Any]:
    return {"mask": nn.Transformer.generate_square_subsequent_mask(SEQ), "is_causal": True}


# name -> (builder, inputs for each variant)
NN_MODELS: dict[str, tuple[Callable[[], nn.Module], dict[str, Callable[[], dict[str, Any]]]]] = {
    "TransformerEncoder": (_encoder, {
        "nomask": lambda: _sequence(False, ""),
        "padding_mask": lambda: _sequence(True, "src_key_padding_mask"),
        "causal_mask": lambda: {**_sequence(False, ""), **_causal()},
    }),
    "MultiheadAttention": (_attention, {
        "nomask": lambda: _sequence(False, ""),
        "key_padding_mask": lambda: _sequence(True, "key_padding_mask"),
        "float_attn_mask": lambda: {**_sequence(False, ""), "attn_mask": torch.randn(SEQ, SEQ)},
    }),
    "LSTM_language_model": (LstmLanguageModel, {
        "nomask": lambda: _text_inputs("causal", False),
        "mask": lambda: _text_inputs("causal", True),
    }),
}
NN_CASES = [(name, variant) for name, (_, variants) in NN_MODELS.items() for variant in variants]


@pytest.mark.parametrize(("name", "variant"), NN_CASES, ids=[f"{n}-{v}" for n, v in NN_CASES])
def test_torch_nn_model_matches_eager(name: str, variant: str) -> None:
    build, variants = NN_MODELS[name]
    torch.manual_seed(0)
    jm = run_against_eager(build().train(), variants[variant], calls=2)
    info = minijit.cache_info(jm)
    assert (info.misses, info.hits) == (1, 1), str(info)


def test_transformer_encoder_fast_path_runs_as_one_opaque_op_per_layer() -> None:
    """In eval mode under no_grad, nn.TransformerEncoderLayer calls torch._transformer_encoder_layer_fwd."""
    torch.manual_seed(0)
    encoder = _encoder().body.eval()
    jm = minijit.jit(encoder)
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_transformer_encoder_layer_fwd", "Meta"):
        # torch 2.11 (the GPU machines'): no meta kernel, so no shapes to trace with; refused with the reason.
        inputs = _sequence(False, "src_key_padding_mask")
        with torch.no_grad(), pytest.raises(minijit.UnsupportedOpError, match="no meta kernel"):
            jm(inputs["x"])
        return
    for masked in (False, True):
        inputs = _sequence(masked, "src_key_padding_mask")
        x, mask = inputs["x"], inputs.get("src_key_padding_mask")
        with torch.no_grad():
            _close(jm(x, src_key_padding_mask=mask), encoder(x, src_key_padding_mask=mask), f"masked={masked}")
    fast = [b for b in minijit.last_traces(jm)[0].bound_symbols if "transformer_encoder_layer_fwd" in b.sym.name]
    assert len(fast) == 2


class _Packed(nn.Module):
    def __init__(self, kind: type[nn.RNNBase]):
        super().__init__()
        self.rnn = kind(4, 3, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0], h[0] if isinstance(h, tuple) else h


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_packed_sequences_match_eager(kind: type[nn.RNNBase]) -> None:
    """pack_padded_sequence, a recurrent net on the packed batch, pad_packed_sequence: their kernels read the lengths
    (batch sizes), so each is recorded whole, run on the real values while tracing, its shapes checked on every call;
    lengths of the same sum and maximum reuse the trace. Outputs and gradients equal eager's."""
    torch.manual_seed(0)
    model = _Packed(kind)
    jitted = minijit.jit(copy.deepcopy(model))
    for lengths in ([5, 3, 2], [2, 5, 3], [4, 5, 1], [3, 1, 2, 2]):
        x = torch.randn(len(lengths), max(lengths), 4)
        x_eager, x_jit = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = model(x_eager, torch.tensor(lengths)), jitted(x_jit, torch.tensor(lengths))
        torch.testing.assert_close(got, want)
        sum(t.sum() for t in want).backward()
        sum(t.sum() for t in got).backward()
        torch.testing.assert_close(x_jit.grad, x_eager.grad)
        for (name, p), q in zip(model.named_parameters(), jitted.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert minijit.cache_info(jitted).hits == 2


def test_a_packed_sequence_argument_matches_eager() -> None:
    """A PackedSequence given to a jitted LSTM: its data's size goes symbolic on the second call; the packed kernel
    (it reads the batch sizes) is never run on fake tensors with symbolic sizes (that crashed the process)."""
    torch.manual_seed(0)
    model = nn.LSTM(3, 4)
    jitted = minijit.jit(copy.deepcopy(model))
    for lengths in ([5, 3, 2], [4, 4, 1], [6, 2]):
        seqs = [torch.randn(n, 3) for n in lengths]
        eager_seqs, jit_seqs = ([s.clone().requires_grad_() for s in seqs] for _ in "ab")
        want, got = model(nn.utils.rnn.pack_sequence(eager_seqs)), jitted(nn.utils.rnn.pack_sequence(jit_seqs))
        torch.testing.assert_close(got[0].data, want[0].data)
        torch.testing.assert_close(got[1], want[1])
        (want[0].data.sum() + want[1][0].sum()).backward()
        (got[0].data.sum() + got[1][0].sum()).backward()
        torch.testing.assert_close([s.grad for s in jit_seqs], [s.grad for s in eager_seqs])

"""A BERT encoder's forward pass in a few plain torch calls, for the embedder's hot path.

For a lone 15-token prompt on this CPU, the library path spends about a quarter to a
third of the pass on per-call Python: transformers' BertModel builds its attention mask,
dispatches through attention backends and runs a pooler the sentence model never reads,
and sentence-transformers adds its own module plumbing. The arithmetic below is the same
(the same weights, layer norms, exact GELU and scaled dot-product attention; the query,
key and value projections fused into one matrix product): in float32 the token vectors
agree with BertModel's to rounding (about 1e-6), so the verifier, trained on BertModel's
features, sees the same inputs.

In bfloat16 (cache/torch_encoder.py picks it where the CPU multiplies bf16 natively) the
weights are also prepacked for oneDNN; a pass then takes about half the float32 time here,
and the vectors stay within a cosine of 1e-4 of float32's.

`BertForward.of` accepts only what it reproduces: a BertModel with absolute positions,
exact GELU and no decoder parts, on the CPU; for anything else it returns None and the
embedder keeps the library's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_TYPICAL_TOKENS = 16  # a prompt's word pieces: oneDNN picks the packed layout for it


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def _packed(weight: torch.Tensor) -> torch.Tensor:
    import torch

    # Private oneDNN ops, the ones torch.compile's CPU backend emits for bf16 linears.
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, _TYPICAL_TOKENS)
    return packed


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    import torch

    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


def _packs_exactly(layer: _Layer) -> bool:
    """Whether this torch build has the packed ops and they give F.linear's result for a
    lone prompt and for a padded batch; if not, the plain products are used."""
    import torch

    try:
        with torch.inference_mode():
            weight = _packed(layer.up_weight)
            for shape in ((1, 5), (3, 40)):
                x = torch.randn(*shape, layer.up_weight.shape[1]).to(layer.up_weight.dtype)
                want = _plain_linear(x, layer.up_weight, layer.up_bias)
                if not torch.equal(_packed_linear(x, weight, layer.up_bias), want):
                    return False
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


@dataclass(frozen=True)
class _Layer:
    qkv_weight: torch.Tensor  # (3 * hidden, hidden): query, key, value stacked
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    norm1: tuple[torch.Tensor, torch.Tensor]
    up_weight: torch.Tensor
    up_bias: torch.Tensor
    down_weight: torch.Tensor
    down_bias: torch.Tensor
    norm2: tuple[torch.Tensor, torch.Tensor]


class BertForward:
    """Last-layer token vectors of a BertModel for single-segment inputs (token type 0)."""

    def __init__(self, model: Any, dtype: torch.dtype | None = None, *, pack: bool = True) -> None:
        import torch

        self._dtype = dtype or torch.float32
        config = model.config
        self._heads = int(config.num_attention_heads)
        self._eps = float(config.layer_norm_eps)
        embeddings = model.embeddings

        def _param(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(self._dtype).contiguous()

        def _norm(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return _param(module.weight), _param(module.bias)

        self._words = _param(embeddings.word_embeddings.weight)
        self._positions = _param(embeddings.position_embeddings.weight)
        self._segment = _param(embeddings.token_type_embeddings.weight[0])
        self._norm0 = _norm(embeddings.LayerNorm)
        self._layers = [
            _Layer(
                qkv_weight=_param(
                    torch.cat(
                        [
                            layer.attention.self.query.weight,
                            layer.attention.self.key.weight,
                            layer.attention.self.value.weight,
                        ]
                    )
                ),
                qkv_bias=_param(
                    torch.cat(
                        [
                            layer.attention.self.query.bias,
                            layer.attention.self.key.bias,
                            layer.attention.self.value.bias,
                        ]
                    )
                ),
                out_weight=_param(layer.attention.output.dense.weight),
                out_bias=_param(layer.attention.output.dense.bias),
                norm1=_norm(layer.attention.output.LayerNorm),
                up_weight=_param(layer.intermediate.dense.weight),
                up_bias=_param(layer.intermediate.dense.bias),
                down_weight=_param(layer.output.dense.weight),
                down_bias=_param(layer.output.dense.bias),
                norm2=_norm(layer.output.LayerNorm),
            )
            for layer in model.encoder.layer
        ]
        self._linear = _plain_linear
        if pack and self._dtype == torch.bfloat16 and _packs_exactly(self._layers[0]):
            self._pack()

    def _pack(self) -> None:
        """Keep the bf16 weights in oneDNN's blocked layout: a product then skips the
        per-call reordering, half the time of each of these small products here, with
        the same result (checked by _packs_exactly)."""
        import dataclasses

        self._layers = [
            dataclasses.replace(
                layer,
                qkv_weight=_packed(layer.qkv_weight),
                out_weight=_packed(layer.out_weight),
                up_weight=_packed(layer.up_weight),
                down_weight=_packed(layer.down_weight),
            )
            for layer in self._layers
        ]
        self._linear = _packed_linear

    @property
    def packed(self) -> bool:
        """Whether the products run on prepacked bf16 weights."""
        return self._linear is _packed_linear

    @property
    def precision(self) -> str:
        return str(self._dtype).removeprefix("torch.")

    @classmethod
    def of(cls, model: Any, dtype: torch.dtype | None = None) -> BertForward | None:
        """A BertForward for `model` if it computes exactly what BertModel does, else None."""
        config = getattr(model, "config", None)
        if type(model).__name__ != "BertModel" or config is None:
            return None
        supported = (
            getattr(config, "position_embedding_type", "absolute") == "absolute"
            and config.hidden_act == "gelu"
            and not getattr(config, "is_decoder", False)
            and not getattr(config, "add_cross_attention", False)
            and config.hidden_size % config.num_attention_heads == 0
        )
        if not supported or next(model.parameters()).device.type != "cpu":
            return None
        return cls(model, dtype)

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, *, always_mask: bool = False
    ) -> torch.Tensor:
        """(batch, tokens) ids and 0/1 mask -> (batch, tokens, hidden) vectors. Call it
        under torch.inference_mode(). `always_mask`: apply the mask even to a batch without
        padding (a graph export must not depend on the values of its inputs)."""
        import torch.nn.functional as F

        batch, length = ids.shape
        hidden = self._words.shape[1]
        x = F.embedding(ids, self._words) + self._positions[:length] + self._segment
        x = F.layer_norm(x, (hidden,), *self._norm0, self._eps)
        # Keys at padding are masked out; a batch without padding needs no mask at all.
        keys = None if not always_mask and bool(mask.all()) else mask.bool()[:, None, None, :]
        split = (batch, length, 3, self._heads, hidden // self._heads)
        for layer in self._layers:
            qkv = self._linear(x, layer.qkv_weight, layer.qkv_bias).view(split)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
            attended = attended.transpose(1, 2).reshape(batch, length, hidden)
            x = F.layer_norm(
                self._linear(attended, layer.out_weight, layer.out_bias) + x,
                (hidden,),
                *layer.norm1,
                self._eps,
            )
            up = F.gelu(self._linear(x, layer.up_weight, layer.up_bias))
            x = F.layer_norm(
                self._linear(up, layer.down_weight, layer.down_bias) + x,
                (hidden,),
                *layer.norm2,
                self._eps,
            )
        return x.float()

import torch
import torch.nn as nn
import math
from typing import Optional, Literal
from dataclasses import dataclass
from torch.nn import Linear, RMSNorm

@dataclass
class ModelArgs:
    """
    Data class for defining model arguments and hyperparameters.

    Attributes:
        max_batch_size (int): Maximum batch size.
        max_seq_len (int): Maximum sequence length.
        dtype (Literal["bf16", "fp8"]): Data type for computations.
        vocab_size (int): Vocabulary size.
        dim (int): Model dimension.
        inter_dim (int): Intermediate dimension for MLP layers.
        moe_inter_dim (int): Intermediate dimension for MoE layers.
        n_layers (int): Number of transformer layers.
        n_dense_layers (int): Number of dense layers in the model.
        n_heads (int): Number of attention heads.
        n_routed_experts (int): Number of routed experts for MoE layers.
        n_shared_experts (int): Number of shared experts for MoE layers.
        n_activated_experts (int): Number of activated experts in MoE layers.
        n_expert_groups (int): Number of expert groups.
        n_limited_groups (int): Number of limited groups for MoE routing.
        score_func (Literal["softmax", "sigmoid"]): Scoring function for MoE routing.
        route_scale (float): Scaling factor for routing scores.
        q_lora_rank (int): LoRA rank for query projections.
        kv_lora_rank (int): LoRA rank for key-value projections.
        qk_nope_head_dim (int): Dimension for query-key projections without positional embeddings.
        qk_rope_head_dim (int): Dimension for query-key projections with rotary embeddings.
        v_head_dim (int): Dimension for value projections.
        original_seq_len (int): Original sequence length.
        rope_theta (float): Base for rotary positional encoding.
        rope_factor (float): Scaling factor for extended sequence lengths.
        beta_fast (int): Fast beta correction factor.
        beta_slow (int): Slow beta correction factor.
        mscale (float): Scaling factor for extended attention.
    """
    max_batch_size: int = 8
    max_seq_len: int = 4096 * 4
    dtype: Literal["bf16", "fp8"] = "bf16"
    vocab_size: int = 102400
    dim: int = 2048
    inter_dim: int = 10944
    moe_inter_dim: int = 1408
    n_layers: int = 27
    n_dense_layers: int = 1
    n_heads: int = 16
    # moe
    n_routed_experts: int = 64
    n_shared_experts: int = 2
    n_activated_experts: int = 6
    n_expert_groups: int = 1
    n_limited_groups: int = 1
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    route_scale: float = 1.
    # mla
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # yarn
    original_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_factor: float = 40
    beta_fast: int = 32
    beta_slow: int = 1
    mscale: float = 1.
    
class Model(nn.Module):
    """
    Multi-Headed Attention Layer (MLA).

    Attributes:
        dim (int): Dimensionality of the input features.
        n_heads (int): Number of attention heads.
        n_local_heads (int): Number of local attention heads for distributed systems.
        q_lora_rank (int): Rank for low-rank query projection.
        kv_lora_rank (int): Rank for low-rank key/value projection.
        qk_nope_head_dim (int): Dimensionality of non-positional query/key projections.
        qk_rope_head_dim (int): Dimensionality of rotary-positional query/key projections.
        qk_head_dim (int): Total dimensionality of query/key projections.
        v_head_dim (int): Dimensionality of value projections.
        softmax_scale (float): Scaling factor for softmax in attention computation.
    """
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dim = args.dim
        self.n_heads = args.n_heads
        self.n_local_heads = args.n_heads
        self.q_lora_rank = args.q_lora_rank
        self.kv_lora_rank = args.kv_lora_rank
        self.qk_nope_head_dim = args.qk_nope_head_dim
        self.qk_rope_head_dim = args.qk_rope_head_dim
        self.qk_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim
        self.v_head_dim = args.v_head_dim

        self.wq_a = Linear(self.dim, self.q_lora_rank)
        self.q_norm = RMSNorm(self.q_lora_rank)
        self.wq_b = Linear(self.q_lora_rank, self.n_heads * self.qk_head_dim)
        self.wkv_a = Linear(self.dim, self.kv_lora_rank + self.qk_rope_head_dim)
        self.kv_norm = RMSNorm(self.kv_lora_rank)
        self.wkv_b = Linear(self.kv_lora_rank, self.n_heads * (self.qk_nope_head_dim + self.v_head_dim))
        self.wo = Linear(self.n_heads * self.v_head_dim, self.dim)
        self.softmax_scale = self.qk_head_dim ** -0.5
        if args.max_seq_len > args.original_seq_len:
            mscale = 0.1 * args.mscale * math.log(args.rope_factor) + 1.0
            self.softmax_scale = self.softmax_scale * mscale * mscale

    def forward(self, x: torch.Tensor, start_pos: int, freqs_cis: torch.Tensor):
        """
        Forward pass for the Multi-Headed Attention Layer (MLA).

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, dim).
            start_pos (int): Starting position in the sequence for caching.
            freqs_cis (torch.Tensor): Precomputed complex exponential values for rotary embeddings.
            mask (Optional[torch.Tensor]): Mask tensor to exclude certain positions from attention.

        Returns:
            torch.Tensor: Output tensor with the same shape as the input.
        """
        bsz, seqlen, _ = x.size()
        end_pos = start_pos + seqlen
        q = self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bsz, seqlen, self.n_local_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary_emb(q_pe, freqs_cis)
        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)
        q = torch.cat([q_nope, q_pe], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv))
        kv = kv.view(bsz, seqlen, self.n_local_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_local_heads, -1)], dim=-1)
        x = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            scale=self.softmax_scale,
            is_causal=True
        )
        x = self.wo(x.flatten(2))
        return x


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """
    Applies rotary positional embeddings to the input tensor.

    Args:
        x (torch.Tensor): Input tensor with positional embeddings to be applied.
        freqs_cis (torch.Tensor): Precomputed complex exponential values for positional embeddings.

    Returns:
        torch.Tensor: Tensor with rotary embeddings applied.
    """
    dtype = x.dtype
    x = torch.view_as_complex(x.float().view(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    y = torch.view_as_real(x * freqs_cis).flatten(3)
    return y.to(dtype)


def precompute_freqs_cis(args: ModelArgs) -> torch.Tensor:
    """
    Precomputes frequency-based complex exponential values for rotary positional embeddings.

    Args:
        args (ModelArgs): Model arguments containing positional embedding parameters.

    Returns:
        torch.Tensor: Precomputed complex exponential values for positional embeddings.
    """
    dim = args.qk_rope_head_dim
    seqlen = args.max_seq_len
    beta_fast = args.beta_fast
    beta_slow = args.beta_slow
    base = args.rope_theta
    factor = args.rope_factor

    def find_correction_dim(num_rotations, dim, base, max_seq_len):
        """
        Computes the correction dimension for a given number of rotations in the rotary positional embedding.

        Args:
            num_rotations (float): Number of rotations to compute the correction for.
            dim (int): Dimensionality of the embedding space.
            base (float): Base value for the exponential computation.
            max_seq_len (int): Maximum sequence length.

        Returns:
            float: The correction dimension based on the input parameters.
        """
        return dim * math.log(max_seq_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_seq_len):
        """
        Computes the range of correction dimensions for rotary positional embeddings.

        Args:
            low_rot (float): Lower bound for the number of rotations.
            high_rot (float): Upper bound for the number of rotations.
            dim (int): Dimensionality of the embedding space.
            base (float): Base value for the exponential computation.
            max_seq_len (int): Maximum sequence length.

        Returns:
            Tuple[int, int]: The range of correction dimensions (low, high), clamped to valid indices.
        """
        low = math.floor(find_correction_dim(low_rot, dim, base, max_seq_len))
        high = math.ceil(find_correction_dim(high_rot, dim, base, max_seq_len))
        return max(low, 0), min(high, dim-1)

    def linear_ramp_factor(min, max, dim):
        """
        Computes a linear ramp function used to smooth values between a minimum and maximum range.

        Args:
            min (float): Minimum value for the ramp function.
            max (float): Maximum value for the ramp function.
            dim (int): Dimensionality of the ramp tensor.

        Returns:
            torch.Tensor: A tensor of shape (dim,) with values linearly interpolated between 0 and 1,
                clamped to the range [0, 1].
        """
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        ramp_func = torch.clamp(linear_func, 0, 1)
        return ramp_func

    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if seqlen > args.original_seq_len:
        low, high = find_correction_range(beta_fast, beta_slow, dim, base, args.original_seq_len)
        smooth = 1 - linear_ramp_factor(low, high, dim // 2)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth

    t = torch.arange(seqlen)
    freqs = torch.outer(t, freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    return freqs_cis


batch_size = 8
seq_len = 1024
model_args = ModelArgs()
freqs_cis = precompute_freqs_cis(model_args)
# print("freqs_cis", freqs_cis.shape, freqs_cis.dtype)

def get_inputs():
    return [torch.randn(batch_size, seq_len, model_args.dim), 0, freqs_cis[:seq_len]]

def get_init_inputs():
    return [model_args]

if __name__ == "__main__":
    model = Model(model_args)
    inputs = get_inputs()
    print(model(*inputs).shape)

# ---- pike offline transformation: sdpa ----
# The reference above, unchanged, wrapped by program transformations that keep its
# results within tolerance. Generated by pike; safe to keep and edit.


class ModelNew(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = Model(*args, **kwargs)
        # rewritten once, on the weights just built; the graph is generic in input shapes
        self.inner, self.attentions_rewritten = _attention_to_sdpa(self.inner)

    def _run(self, *inputs):
        return self.inner(*inputs)

    def forward(self, *inputs):
        return self._run(*inputs)


def _signature(inputs):
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors or any(not x.is_cuda for x in tensors):
        return None
    return tuple((tuple(x.shape), x.dtype, x.device, x.stride()) for x in tensors) + tuple(
        repr(x) for x in inputs if not isinstance(x, torch.Tensor))


def _device_of(inputs):
    return next((x.device.type for x in inputs if isinstance(x, torch.Tensor)), "cpu")


def _clone(out):
    # Outputs leave the graph's static buffers and inference mode as ordinary tensors.
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_clone(o) for o in out)
    return out


def _cast_like(out, inputs):
    dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)
                  and x.is_floating_point()), torch.float32)
    if isinstance(out, torch.Tensor):
        return out.to(dtype) if out.is_floating_point() else out
    if isinstance(out, (list, tuple)):
        return type(out)(_cast_like(o, inputs) for o in out)
    return out


# ---- attention to scaled_dot_product_attention (torch.fx) ----
# Rewrites softmax(q @ k^T * scale [masked causally with -inf]) [dropout p=0] @ v into one
# F.scaled_dot_product_attention call, only where the traced graph matches that exactly:
# the mask must be provably causal (tril of ones built in forward, or a registered buffer
# that is tril of ones, sliced [..., :T, :T]); anything else is left as written.
# Also: an nn.MultiheadAttention called with query, key and value only, whose attention
# weights (its second output) nothing uses, is called with need_weights=False, so it
# attends through the same fused call instead of building and averaging the full weight
# matrix it would throw away.
import inspect as _inspect
import operator as _operator

import torch.fx as _fx
import torch.nn.functional as _F

_MATMULS = {_operator.matmul, torch.matmul}
_SOFTMAXES = {torch.softmax, _F.softmax}


def _is(node, names, functions=()):
    return isinstance(node, _fx.Node) and (
        (node.op == "call_method" and node.target in names)
        or (node.op == "call_function" and node.target in functions))


def _arg(node, index, name, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _only_use(node):
    return len(node.users) == 1


def _transposed_last_two(node):
    """k for k.transpose(-2, -1) (either order), else None."""
    if not _is(node, {"transpose"}, {torch.transpose}) or len(node.args) != 3:
        return None
    return node.args[0] if set(node.args[1:]) == {-2, -1} else None


def _tril_of_ones(node):
    """The node for n when `node` is tril(ones(n, n)) (or a view ending in (n, n))."""
    if _is(node, {"view", "reshape"}):
        last = list(node.args[1:])[-2:]
        inner = _tril_of_ones(node.args[0])
        return inner if inner is not None and last == [inner, inner] else None
    if not _is(node, {"tril"}, {torch.tril}) or _arg(node, 1, "diagonal", 0) != 0:
        return None
    ones = node.args[0] if _is(node, {"tril"}) else _arg(node, 0, "input")
    if not _is(ones, set(), {torch.ones}) or len(ones.args) != 2 or "dtype" in ones.kwargs:
        return None
    return ones.args[0] if ones.args[0] == ones.args[1] else None


def _causal_buffer(module, node):
    """True when `node` is buffer[:, ..., :T, :T] of a buffer that is tril of ones."""
    if not (isinstance(node, _fx.Node) and node.op == "call_function"
            and node.target is _operator.getitem and node.args[0].op == "get_attr"):
        return False
    index = node.args[1]
    if not isinstance(index, tuple) or len(index) < 2:
        return False
    *lead, rows, cols = index
    full = slice(None, None, None)
    if any(s != full for s in lead) or not (isinstance(rows, slice) and rows == cols):
        return False
    if rows.start is not None or rows.step is not None:
        return False
    try:
        buffer = module.get_buffer(node.args[0].target)
    except AttributeError:
        return False
    return buffer.dim() >= 2 and torch.equal(buffer, torch.tril(torch.ones_like(buffer)))


def _causal_mask(module, masked):
    """For scores.masked_fill(mask == 0, -inf) with a causal mask: (scores, mask == 0)."""
    if not (_is(masked, {"masked_fill"}, {torch.masked_fill}) and len(masked.args) == 3
            and not masked.kwargs and _only_use(masked)):
        return None
    scores, condition, value = masked.args
    if value != float("-inf") or not _is(condition, {"eq"}, {_operator.eq, torch.eq}):
        return None
    if len(condition.args) != 2 or condition.kwargs or not _only_use(condition):
        return None
    mask, zero = condition.args
    if zero != 0 or (_tril_of_ones(mask) is None and not _causal_buffer(module, mask)):
        return None
    return scores, condition, masked


def _scaled_scores(node):
    """(q, k, scale, nodes) for (q @ k^T) * scale, (q @ k^T) / d or q @ k^T, each used
    once; `nodes` are the steps the fused call replaces."""
    scale, nodes = 1.0, []
    if _is(node, set(), {_operator.mul, torch.mul}):
        if len(node.args) != 2 or node.kwargs or not _only_use(node):
            return None
        nodes.append(node)
        left, right = node.args
        node, scale = (left, right) if _is(left, set(), _MATMULS) else (right, left)
    elif _is(node, set(), {_operator.truediv, torch.div}):
        if len(node.args) != 2 or node.kwargs or not _only_use(node):  # rounding_mode: no
            return None
        nodes.append(node)
        node, scale = node.args[0], ("divide", node.args[1])
    if not (_is(node, {"matmul"}, _MATMULS) and len(node.args) == 2 and not node.kwargs
            and _only_use(node)):
        return None
    q, k_t = node.args
    k = _transposed_last_two(k_t)
    if k is None or k_t.kwargs or not _only_use(k_t):
        return None
    return q, k, scale, [*nodes, node, k_t]


_FACTORIES = ("ones", "zeros", "full", "empty", "arange", "eye", "linspace",
              "rand", "randn", "randint", "randperm")


class _BufferTracer(_fx.Tracer):
    """Records buffers as graph inputs too (fx's default passes them in as tensors), so a
    buffer sliced by a traced size (self.bias[:, :, :T, :T]) traces."""

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if isinstance(attr_val, torch.Tensor) and not isinstance(attr_val, torch.nn.Parameter):
            for name, buffer in self.root.named_buffers():
                if buffer is attr_val:
                    if name not in parameter_proxy_cache:
                        parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
                    return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)


def _state(module):
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules))
            for m in module.modules()]


def _restore(saved):
    # a forward that caches something on first call would keep a traced value otherwise
    for m, attributes, parameters, buffers, modules in saved:
        for live, kept in ((m._parameters, parameters), (m._buffers, buffers),
                           (m._modules, modules)):
            live.clear()
            live.update(kept)
        m.__dict__.clear()
        m.__dict__.update(attributes)


def _trace(module):
    """The module's graph. Tensor factories become calls in it (sized by traced values, or
    random: neither may be frozen into a constant), and the module is left as it was."""
    tracer = _BufferTracer()
    originals = {name: getattr(torch, name) for name in _FACTORIES}

    def recorded(factory):
        def call(*args, **kwargs):
            return tracer.create_proxy("call_function", factory, args, kwargs)
        return call

    saved = _state(module)
    try:
        for name, factory in originals.items():
            setattr(torch, name, recorded(factory))
        graph = tracer.trace(module)
    finally:
        for name, factory in originals.items():
            setattr(torch, name, factory)
        _restore(saved)
    return _fx.GraphModule(module, graph, type(module).__name__)


def _traceable(module):
    """The traced module, or None where a trace would not stand for every call: a forward
    with optional arguments (the trace takes one branch of `is None`), or one whose code
    depends on train/eval mode in Python (the trace would keep the mode it saw)."""
    parameters = list(_inspect.signature(module.forward).parameters.values())
    if any(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
           for p in parameters):
        return None
    mode = module.training
    try:
        module.train(not mode)
        other = _trace(module).code
    finally:
        module.train(mode)
    traced = _trace(module)
    return traced if traced.code == other else None


def _attention_to_sdpa(module):
    """The module traced and rewritten, with the number of attentions rewritten; the module
    itself (and 0) where tracing fails, nothing matches or anything goes wrong."""
    try:
        traced = _traceable(module)
        rewritten = _rewrite(traced) if traced is not None else 0
    except Exception:  # control flow on tensors and the like: keep the module as written
        return module, 0
    return (traced, rewritten) if rewritten else (module, 0)


def _rewrite(traced):
    return _multihead_without_weights(traced) + _written_attention(traced)


def _multihead_without_weights(traced):
    graph, rewritten = traced.graph, 0
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        attention = traced.get_submodule(node.target)
        if not isinstance(attention, torch.nn.MultiheadAttention):
            continue
        if attention.dropout and attention.training:
            continue  # random either way, but left as written
        if attention._forward_hooks or attention._forward_pre_hooks:
            continue  # a hook may read the weights or change the call
        # Plain calls only: with a mask, fully masked rows give NaN with the weights and 0
        # without them, and is_causal=True without them drops attn_mask for a top-left
        # causal mask, which need not be the mask given.
        if len(node.args) > 3 or set(node.kwargs) - {"need_weights", "average_attn_weights"}:
            continue
        if node.kwargs.get("need_weights", True) is not True:
            continue  # already off
        users = list(node.users)
        if not users or any(not (u.op == "call_function" and u.target is _operator.getitem
                                 and u.args[1] in (0, 1)) for u in users):
            continue  # the output tuple is used whole
        if any(u.args[1] == 1 and u.users for u in users):
            continue  # the weights are used
        for user in users:
            if user.args[1] == 1:
                graph.erase_node(user)
        node.kwargs = {**node.kwargs, "need_weights": False}
        rewritten += 1
    if rewritten:
        traced.recompile()
    return rewritten


def _written_attention(traced):
    graph, rewritten = traced.graph, 0
    for out in list(graph.nodes):
        if not (_is(out, {"matmul"}, _MATMULS) and len(out.args) == 2 and not out.kwargs):
            continue
        weights, v = out.args
        chain = [out]  # the steps the fused call replaces, each used only by the one before
        if isinstance(weights, _fx.Node) and weights.op == "call_module":
            dropout = traced.get_submodule(weights.target)
            if not isinstance(dropout, torch.nn.Dropout) or (dropout.p and dropout.training):
                continue  # a random dropout of the weights has no exact fused form here
            if not _only_use(weights) or len(weights.args) != 1:
                continue
            chain.append(weights)
            weights = weights.args[0]
        if not _is(weights, {"softmax"}, _SOFTMAXES) or not _only_use(weights):
            continue
        if _arg(weights, 1, "dim") != -1 or _arg(weights, 2, "dtype") is not None:
            continue
        if set(weights.kwargs) - {"dim", "dtype", "_stacklevel"} or not weights.args:
            continue
        chain.append(weights)
        scores, condition = weights.args[0], None
        masked = _causal_mask(traced, scores)
        if masked is not None:
            scores, condition, masked_fill = masked
            chain.append(masked_fill)
        found = _scaled_scores(scores)
        if found is None:
            continue
        q, k, scale, steps = found
        with graph.inserting_before(out):
            if isinstance(scale, tuple):  # divided by d: the scale is 1 / d
                scale = graph.call_function(_operator.truediv, (1.0, scale[1]))
            sdpa = graph.call_function(_attention, (q, k, v, scale, condition))
        out.replace_all_uses_with(sdpa)
        # only these: fx counts in-place methods as pure, so a general dead-code pass
        # could drop a statement like `h.relu_()` elsewhere in the forward
        for node in [*chain, *steps]:
            graph.erase_node(node)
        rewritten += 1
    if rewritten:
        traced.recompile()
    return rewritten


def _attention(q, k, v, scale, masked):
    """softmax(q @ k^T * scale, with -inf where `masked`) @ v, fused where that is exact:
    `masked` is None or the causal mask of a square score matrix."""
    length, keys = q.shape[-2], k.shape[-2]
    causal = masked is not None
    square = not causal or (length == keys and tuple(masked.shape[-2:]) == (length, keys))
    same_batch = q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
    if isinstance(scale, torch.Tensor) or not (square and same_batch) or q.dim() < 3:
        scores = (q @ k.transpose(-2, -1)) * scale
        if causal:
            scores = scores.masked_fill(masked, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
    return _F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=float(scale))

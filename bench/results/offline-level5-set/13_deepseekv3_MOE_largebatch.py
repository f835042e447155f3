import math
from dataclasses import dataclass
from typing import Tuple, Optional, Literal

import torch
from torch import nn
import torch.nn.functional as F


from typing import Tuple

import torch
import triton
import triton.language as tl
from triton import Config


@triton.jit
def act_quant_kernel(x_ptr, y_ptr, s_ptr, BLOCK_SIZE: tl.constexpr):
    """
    Quantizes the input tensor `x_ptr` and stores the result in `y_ptr` and the scaling factor in `s_ptr`.

    Args:
        x_ptr (triton.Pointer): Pointer to the input tensor.
        y_ptr (triton.Pointer): Pointer to the output tensor where quantized values will be stored.
        s_ptr (triton.Pointer): Pointer to the output tensor where scaling factors will be stored.
        BLOCK_SIZE (tl.constexpr): The size of the block to be processed by each program instance.

    Returns:
        None
    """
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offs).to(tl.float32)
    s = tl.max(tl.abs(x)) / 448.
    y = x / s
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, y)
    tl.store(s_ptr + pid, s)


def act_quant(x: torch.Tensor, block_size: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """
    Quantizes the input tensor `x` using block-wise quantization.

    Args:
        x (torch.Tensor): The input tensor to be quantized. Must be contiguous and its last dimension size must be divisible by `block_size`.
        block_size (int, optional): The size of the blocks to be used for quantization. Default is 128.

    Returns:
        Tuple[torch.Tensor, torch.Tensor]: A tuple containing:
            - The quantized tensor with dtype `torch.float8_e4m3fn`.
            - A tensor of scaling factors with dtype `torch.float32`.
    """
    assert x.is_contiguous()
    assert x.size(-1) % block_size == 0
    y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    s = x.new_empty(*x.size()[:-1], x.size(-1) // block_size, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(x.numel(), meta['BLOCK_SIZE']), )
    act_quant_kernel[grid](x, y, s, BLOCK_SIZE=block_size)
    return y, s


@triton.jit
def weight_dequant_kernel(x_ptr, s_ptr, y_ptr, M, N, BLOCK_SIZE: tl.constexpr):
    """
    Dequantizes weights using the provided scaling factors and stores the result.

    Args:
        x_ptr (tl.pointer): Pointer to the quantized weights.
        s_ptr (tl.pointer): Pointer to the scaling factors.
        y_ptr (tl.pointer): Pointer to the output buffer for dequantized weights.
        M (int): Number of rows in the weight matrix.
        N (int): Number of columns in the weight matrix.
        BLOCK_SIZE (tl.constexpr): Size of the block for tiling.

    Returns:
        None
    """
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    n = tl.cdiv(N, BLOCK_SIZE)
    offs_m = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    offs_n = pid_n * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    offs = offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    s = tl.load(s_ptr + pid_m * n + pid_n)
    y = x * s
    tl.store(y_ptr + offs, y, mask=mask)


def weight_dequant(x: torch.Tensor, s: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """
    Dequantizes the given weight tensor using the provided scale tensor.

    Args:
        x (torch.Tensor): The quantized weight tensor of shape (M, N).
        s (torch.Tensor): The scale tensor of shape (M, N).
        block_size (int, optional): The block size to use for dequantization. Defaults to 128.

    Returns:
        torch.Tensor: The dequantized weight tensor of the same shape as `x`.

    Raises:
        AssertionError: If `x` or `s` are not contiguous or if their dimensions are not 2.
    """
    assert x.is_contiguous() and s.is_contiguous()
    assert x.dim() == 2 and s.dim() == 2
    M, N = x.size()
    y = torch.empty_like(x, dtype=torch.get_default_dtype())
    grid = lambda meta: (triton.cdiv(M, meta['BLOCK_SIZE']), triton.cdiv(N, meta['BLOCK_SIZE']))
    weight_dequant_kernel[grid](x, s, y, M, N, BLOCK_SIZE=block_size)
    return y


fp8_gemm_configs = [
    Config({'BLOCK_SIZE_M': block_m, 'BLOCK_SIZE_N': block_n, 'BLOCK_SIZE_K': 128}, num_stages=num_stages, num_warps=8)
    for block_m in [16, 32, 64] for block_n in [32, 64, 128] for num_stages in [3, 4, 5, 6]
]

@triton.autotune(configs=fp8_gemm_configs, key=['N', 'K'])
@triton.jit
def fp8_gemm_kernel(a_ptr, b_ptr, c_ptr,
                    a_s_ptr, b_s_ptr,
                    M, N: tl.constexpr, K: tl.constexpr,
                    BLOCK_SIZE_M: tl.constexpr,
                    BLOCK_SIZE_N: tl.constexpr,
                    BLOCK_SIZE_K: tl.constexpr):
    """
    Performs a matrix multiplication operation on FP8 matrices with scaling factors.

    Args:
        a_ptr (tl.tensor): Pointer to the first input matrix A.
        b_ptr (tl.tensor): Pointer to the second input matrix B.
        c_ptr (tl.tensor): Pointer to the output matrix C.
        a_s_ptr (tl.tensor): Pointer to the scaling factors for matrix A.
        b_s_ptr (tl.tensor): Pointer to the scaling factors for matrix B.
        M (int): Number of rows in matrix A and C.
        N (tl.constexpr): Number of columns in matrix B and C.
        K (tl.constexpr): Number of columns in matrix A and rows in matrix B.
        BLOCK_SIZE_M (tl.constexpr): Block size for the M dimension.
        BLOCK_SIZE_N (tl.constexpr): Block size for the N dimension.
        BLOCK_SIZE_K (tl.constexpr): Block size for the K dimension.

    Returns:
        None
    """
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    k = tl.cdiv(K, BLOCK_SIZE_K)
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * K + offs_k[:, None]
    a_s_ptrs = a_s_ptr + offs_m * k
    b_s_ptrs = b_s_ptr + (offs_n // BLOCK_SIZE_K) * k

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for i in range(k):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - i * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - i * BLOCK_SIZE_K, other=0.0)
        a_s = tl.load(a_s_ptrs)
        b_s = tl.load(b_s_ptrs)
        accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K
        a_s_ptrs += 1
        b_s_ptrs += 1
    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, c, mask=mask)


def fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor):
    """
    Perform a matrix multiplication using FP8 precision.

    Args:
        a (torch.Tensor): The first input matrix, must be contiguous.
        a_s (torch.Tensor): The scaling factor for the first input matrix, must be contiguous.
        b (torch.Tensor): The second input matrix, must be contiguous.
        b_s (torch.Tensor): The scaling factor for the second input matrix, must be contiguous.

    Returns:
        torch.Tensor: The result of the matrix multiplication.
    """
    assert a.is_contiguous() and b.is_contiguous()
    assert a_s.is_contiguous() and b_s.is_contiguous()
    K = a.size(-1)
    M = a.numel() // K
    N = b.size(0)
    c = a.new_empty(*a.size()[:-1], N, dtype=torch.get_default_dtype())
    grid = lambda META: (triton.cdiv(M, META['BLOCK_SIZE_M']), triton.cdiv(N, META['BLOCK_SIZE_N']))
    fp8_gemm_kernel[grid](a, b, c, a_s, b_s, M, N, K)
    return c

block_size = 128
gemm_impl: Literal["bf16", "fp8"] = "bf16"
attn_impl: Literal["naive", "absorb"] = "absorb"

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
    q_lora_rank: int = 0
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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """
    Applies a linear transformation to the incoming data: y = xA^T + b.
    This function supports specialized implementations based on quantization
    and tensor formats.

    Args:
        x (torch.Tensor): The input tensor.
        weight (torch.Tensor): The weight tensor. It may be quantized and 
            requires dequantization for certain cases.
        bias (Optional[torch.Tensor]): The bias tensor to be added. Default is None.

    Returns:
        torch.Tensor: The result of the linear transformation, which may involve 
        quantization-aware computations depending on the input parameters.

    Notes:
        - If `weight` is quantized (e.g., `element_size() > 1`), a dequantized version 
          is used for computation.
        - If `gemm_impl == "bf16"`, dequantization and a `bf16` GEMM operation are applied.
        - For other cases, the function applies quantization to `x` and uses `fp8_gemm` for computation.
    """
    if weight.element_size() > 1:
        return F.linear(x, weight, bias)
    elif gemm_impl == "bf16":
        weight = weight_dequant(weight, weight.scale)
        return F.linear(x, weight, bias)
    else:
        x, scale = act_quant(x, block_size)
        y = fp8_gemm(x, scale, weight, weight.scale)
        if bias is not None:
            y += bias
        return y


class Linear(nn.Module):
    """
    Custom linear layer with support for quantized weights and optional bias.

    Args:
        in_features (int): Number of input features.
        out_features (int): Number of output features.
        bias (bool): Whether to include a bias term. Defaults to False.
        dtype (optional): Data type for the layer. Defaults to `torch.bfloat16`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=dtype) * in_features**-0.5)
        if self.weight.element_size() == 1:
            scale_out_features = (out_features + block_size - 1) // block_size
            scale_in_features = (in_features + block_size - 1) // block_size
            self.weight.scale = self.scale = nn.Parameter(torch.randn(scale_out_features, scale_in_features, dtype=torch.float32))
        else:
            self.register_parameter("scale", None)
        if bias:
            self.bias = nn.Parameter(torch.randn(out_features))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Forward pass for the custom linear layer.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Transformed tensor after linear computation.
        """
        return linear(x, self.weight, self.bias)




class RMSNorm(nn.Module):
    """
    Root Mean Square Layer Normalization (RMSNorm).

    Args:
        dim (int): Dimension of the input tensor.
        eps (float): Epsilon value for numerical stability. Defaults to 1e-6.
    """
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor):
        """
        Forward pass for RMSNorm.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Normalized tensor with the same shape as input.
        """
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


def precompute_freqs_cis(args: ModelArgs) -> torch.Tensor:
    """
    Precomputes frequency-based complex exponential values for rotary positional 
            embeddings.

    Args:
        args (ModelArgs): Model arguments containing positional embedding parameters.

    Returns:
        torch.Tensor: Precomputed complex exponential values for positional 
                embeddings.
    """
    dim = args.qk_rope_head_dim
    seqlen = args.max_seq_len
    beta_fast = args.beta_fast
    beta_slow = args.beta_slow
    base = args.rope_theta
    factor = args.rope_factor

    def find_correction_dim(num_rotations, dim, base, max_seq_len):
        """
        Computes the correction dimension for a given number of rotations in the 
                rotary positional embedding.

        Args:
            num_rotations (float): Number of rotations to compute the correction for.
            dim (int): Dimensionality of the embedding space.
            base (float): Base value for the exponential computation.
            max_seq_len (int): Maximum sequence length.

        Returns:
            float: The correction dimension based on the input parameters.
        """
        return dim * math.log(max_seq_len / (num_rotations * 2 * math.pi)) / (2 * 
                math.log(base))

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
            Tuple[int, int]: The range of correction dimensions (low, high), clamped 
                    to valid indices.
        """
        low = math.floor(find_correction_dim(low_rot, dim, base, max_seq_len))
        high = math.ceil(find_correction_dim(high_rot, dim, base, max_seq_len))
        return max(low, 0), min(high, dim-1)

    def linear_ramp_factor(min, max, dim):
        """
        Computes a linear ramp function used to smooth values between a minimum and 
                maximum range.

        Args:
            min (float): Minimum value for the ramp function.
            max (float): Maximum value for the ramp function.
            dim (int): Dimensionality of the ramp tensor.

        Returns:
            torch.Tensor: A tensor of shape (dim,) with values linearly interpolated 
                    between 0 and 1,
                clamped to the range [0, 1].
        """
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        ramp_func = torch.clamp(linear_func, 0, 1)
        return ramp_func

    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if seqlen > args.original_seq_len:
        low, high = find_correction_range(beta_fast, beta_slow, dim, base, args.
                original_seq_len)
        smooth = 1 - linear_ramp_factor(low, high, dim // 2)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth

    t = torch.arange(seqlen)
    freqs = torch.outer(t, freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    return freqs_cis


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """
    Applies rotary positional embeddings to the input tensor.

    Args:
        x (torch.Tensor): Input tensor with positional embeddings to be applied.
        freqs_cis (torch.Tensor): Precomputed complex exponential values for 
                positional embeddings.

    Returns:
        torch.Tensor: Tensor with rotary embeddings applied.
    """
    dtype = x.dtype
    x = torch.view_as_complex(x.float().view(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    y = torch.view_as_real(x * freqs_cis).flatten(3)
    return y.to(dtype)



class MLP(nn.Module):
    """
    Multi-Layer Perceptron (MLP) used as a feed-forward layer.

    Attributes:
        w1 (nn.Module): Linear layer for input-to-hidden transformation.
        w2 (nn.Module): Linear layer for hidden-to-output transformation.
        w3 (nn.Module): Additional linear layer for feature transformation.
    """
    def __init__(self, dim: int, inter_dim: int):
        """
        Initializes the MLP layer.

        Args:
            dim (int): Input and output dimensionality.
            inter_dim (int): Hidden layer dimensionality.
        """
        super().__init__()
        self.w1 = Linear(dim, inter_dim)
        self.w2 = Linear(inter_dim, dim)
        self.w3 = Linear(dim, inter_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Forward pass for the MLP layer.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Output tensor after MLP computation.
        """
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Gate(nn.Module):
    """
    Gating mechanism for routing inputs in a mixture-of-experts (MoE) model.

    Attributes:
        dim (int): Dimensionality of input features.
        topk (int): Number of top experts activated for each input.
        n_groups (int): Number of groups for routing.
        topk_groups (int): Number of groups to route inputs to.
        score_func (str): Scoring function ('softmax' or 'sigmoid').
        route_scale (float): Scaling factor for routing weights.
        weight (torch.nn.Parameter): Learnable weights for the gate.
        bias (Optional[torch.nn.Parameter]): Optional bias term for the gate.
    """
    def __init__(self, args: ModelArgs):
        """
        Initializes the Gate module.

        Args:
            args (ModelArgs): Model arguments containing gating parameters.
        """
        super().__init__()
        self.dim = args.dim
        self.topk = args.n_activated_experts
        self.n_groups = args.n_expert_groups
        self.topk_groups = args.n_limited_groups
        self.score_func = args.score_func
        self.route_scale = args.route_scale
        self.weight = nn.Parameter(torch.randn(args.n_routed_experts, args.dim))
        self.bias = nn.Parameter(torch.randn(args.n_routed_experts)) if self.dim == 7168 else None

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """
        Forward pass for the gating mechanism.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            Tuple[torch.Tensor, torch.Tensor]: Routing weights and selected expert indices.
        """
        scores = linear(x, self.weight)
        if self.score_func == "softmax":
            scores = scores.softmax(dim=-1, dtype=torch.float32)
        else:
            scores = scores.sigmoid()
        original_scores = scores
        if self.bias is not None:
            scores = scores + self.bias
        if self.n_groups > 1:
            scores = scores.view(x.size(0), self.n_groups, -1)
            if self.bias is None:
                group_scores = scores.amax(dim=-1)
            else:
                group_scores = scores.topk(2, dim=-1)[0].sum(dim=-1)
            indices = group_scores.topk(self.topk_groups, dim=-1)[1]
            mask = torch.zeros_like(scores[..., 0]).scatter_(1, indices, True)
            scores = (scores * mask.unsqueeze(-1)).flatten(1)
        indices = torch.topk(scores, self.topk, dim=-1)[1]
        weights = original_scores.gather(1, indices)
        if self.score_func == "sigmoid":
            weights /= weights.sum(dim=-1, keepdim=True)
        weights *= self.route_scale
        return weights.type_as(x), indices


class Expert(nn.Module):
    """
    Expert layer for Mixture-of-Experts (MoE) models.

    Attributes:
        w1 (nn.Module): Linear layer for input-to-hidden transformation.
        w2 (nn.Module): Linear layer for hidden-to-output transformation.
        w3 (nn.Module): Additional linear layer for feature transformation.
    """
    def __init__(self, dim: int, inter_dim: int):
        """
        Initializes the Expert layer.

        Args:
            dim (int): Input and output dimensionality.
            inter_dim (int): Hidden layer dimensionality.
        """
        super().__init__()
        self.w1 = Linear(dim, inter_dim)
        self.w2 = Linear(inter_dim, dim)
        self.w3 = Linear(dim, inter_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Forward pass for the Expert layer.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Output tensor after expert computation.
        """
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Model(nn.Module):
    """
    Mixture-of-Experts (MoE) module.

    Attributes:
        dim (int): Dimensionality of input features.
        n_routed_experts (int): Total number of experts in the model.
        n_activated_experts (int): Number of experts activated for each input.
        gate (nn.Module): Gating mechanism to route inputs to experts.
        experts (nn.ModuleList): List of expert modules.
        shared_experts (nn.Module): Shared experts applied to all inputs.
    """
    def __init__(self, args: ModelArgs):
        """
        Initializes the MoE module.

        Args:
            args (ModelArgs): Model arguments containing MoE parameters.
        """
        super().__init__()
        self.dim = args.dim
        self.n_routed_experts = args.n_routed_experts
        self.n_activated_experts = args.n_activated_experts
        self.gate = Gate(args)
        self.experts = nn.ModuleList([Expert(args.dim, args.moe_inter_dim) for _ in range(self.n_routed_experts)])
        self.shared_experts = MLP(args.dim, args.n_shared_experts * args.moe_inter_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Forward pass for the MoE module.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Output tensor after expert routing and computation.
        """
        shape = x.size()
        x = x.view(-1, self.dim)
        weights, indices = self.gate(x)
        y = torch.zeros_like(x)
        counts = torch.bincount(indices.flatten(), minlength=self.n_routed_experts).tolist()
        for i in range(self.n_routed_experts):
            if counts[i] == 0:
                continue
            expert = self.experts[i]
            idx, top = torch.where(indices == i)
            y[idx] += expert(x[idx]) * weights[idx, top, None]
        z = self.shared_experts(x)
        print("shared expert std", z.std(), "routed expert std", y.std())
        return (y + z).view(shape)

batch_size = 8
seq_len = 1024
model_args = ModelArgs()

def get_inputs():
    return [torch.randn(batch_size, seq_len, model_args.dim)]

def get_init_inputs():
    return [model_args]

if __name__ == "__main__":
    torch.set_default_device("cuda")
    torch.manual_seed(0)
    args = ModelArgs()
    x = get_inputs()
    model = Model(args)
    print(model(*x).size())

# ---- pike offline transformation: moe_grouped + sdpa ----
# The reference above, unchanged, wrapped by program transformations that keep its
# results within tolerance. Generated by pike; safe to keep and edit.


class ModelNew(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = Model(*args, **kwargs)
        # rewritten once, on the weights just built; the graph is generic in input shapes
        self.inner, self.attentions_rewritten = _attention_to_sdpa(self.inner)
        # each mixture of experts' loop over its experts, as one grouped computation
        self.experts_grouped = _group_experts(self.inner)

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


# ---- tracing a module's forward (torch.fx), for the rewrites below ----
import inspect as _inspect
import operator as _operator

import torch.fx as _fx
import torch.nn.functional as _F

_MATMULS = {_operator.matmul, torch.matmul}


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



# ---- attention to scaled_dot_product_attention (torch.fx) ----
# Rewrites softmax(q @ k^T * scale [masked causally with -inf]) [dropout p=0] @ v into one
# F.scaled_dot_product_attention call, only where the traced graph matches that exactly:
# the mask must be provably causal (tril of ones built in forward, or a registered buffer
# that is tril of ones, sliced [..., :T, :T]); anything else is left as written.
# Also: an nn.MultiheadAttention called with query, key and value only, whose attention
# weights (its second output) nothing uses, is called with need_weights=False, so it
# attends through the same fused call instead of building and averaging the full weight
# matrix it would throw away.
_SOFTMAXES = {torch.softmax, _F.softmax}


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




# ---- routed experts as one grouped computation ----
# The forward below is its class's own, with the loop over its experts replaced by one
# call: every expert's tokens are gathered into one padded batch and go through three
# batched products over the experts' stacked weights (w2(silu(w1(x)) * w3(x)), SwiGLU),
# instead of a gather, three small products and a scatter-add per expert. Each token's
# expert outputs are added in ascending expert order, in the output's dtype, as the loop
# adds them. Any other form (another activation, a bias, hooks, other shapes, weights that
# do not stack) runs the loop as written.
import types as _types


def _Model_forward_grouped(self, x: torch.Tensor) -> torch.Tensor:
    """
        Forward pass for the MoE module.

        Args:
            x (torch.Tensor): Input tensor.

        Returns:
            torch.Tensor: Output tensor after expert routing and computation.
        """
    shape = x.size()
    x = x.view(-1, self.dim)
    weights, indices = self.gate(x)
    y = torch.zeros_like(x)
    _grouped_experts(self.experts, self.n_routed_experts, x, weights, indices, y)
    z = self.shared_experts(x)
    print('shared expert std', z.std(), 'routed expert std', y.std())
    return (y + z).view(shape)


_GROUPED_FORWARDS = {
    "Model": _Model_forward_grouped,
}


def _group_experts(model):
    """Each module of a class above takes its rewritten forward; how many did."""
    grouped = 0
    for module in model.modules():
        function = _GROUPED_FORWARDS.get(type(module).__name__)
        if function is not None and type(module) is globals().get(type(module).__name__):
            module.forward = _types.MethodType(function, module)
            grouped += 1
    return grouped


@torch.compiler.disable  # its shapes follow the routing: a build per new capacity otherwise
def _grouped_experts(experts, n, x, weights, indices, out):
    """out[t] += sum over t's routes j of weights[t, j] * experts[indices[t, j]](x[t]),
    as the loop over the first `n` experts computes it."""
    stack = _expert_stack(experts, n, x, weights, indices, out)
    if stack is None:
        return _each_expert(experts, n, x, weights, indices, out)
    gate_up, down = stack
    tokens, k = indices.shape
    flat = indices.reshape(-1)
    # counted without bincount, which on a GPU syncs with the host twice more
    counts = torch.zeros(n, dtype=torch.long, device=x.device).scatter_add_(
        0, flat.clamp(0, n - 1), torch.ones_like(flat, dtype=torch.long))
    rank = torch.argsort(indices, dim=1, stable=True)  # ascending expert, as the loop adds
    ascending = indices.gather(1, rank)
    odd = ((flat < 0) | (flat >= n)).sum() + (ascending[:, 1:] == ascending[:, :-1]).sum()
    # The one host sync, as the loop's counts. Where a route goes to no expert of the
    # loop's (a negative or too large index), or a token to one expert twice (the loop's
    # indexed add then keeps one of the two), the loop as written runs instead; so it does
    # where routing is so uneven that the padded batch would be mostly padding.
    capacity, odd = torch.stack([counts.max(), odd]).tolist()
    if odd or n * capacity > 4 * flat.numel() + 64 * n:
        return _each_expert(experts, n, x, weights, indices, out)
    order = torch.argsort(flat, stable=True)  # the routes, grouped by expert
    expert = flat[order]
    slot = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[expert]
    batch = x.new_zeros(n, capacity, x.shape[1])
    batch[expert, slot] = x[order // k]
    hidden = torch.bmm(batch, gate_up.transpose(1, 2))
    gate, up = hidden.chunk(2, dim=-1)
    hidden = torch.nn.functional.silu(gate) * up
    routed = torch.bmm(hidden, down.transpose(1, 2))[expert, slot]
    per_route = torch.empty_like(routed)
    per_route[order] = routed
    per_route = per_route.view(tokens, k, -1) * weights[..., None]
    per_route = per_route.gather(1, rank[..., None].expand_as(per_route))
    for j in range(k):
        out += per_route[:, j]


def _each_expert(experts, n, x, weights, indices, out):
    for i in range(n):  # the loop as written
        idx, top = torch.where(indices == i)
        if idx.numel():
            out[idx] += experts[i](x[idx]) * weights[idx, top, None]


_LAYERS = ("w1", "w3", "w2")


def _expert_stack(experts, n, x, weights, indices, out):
    """The experts' stacked (w1 and w3, w2) weights for x's device and dtype, built on
    first use; None where the grouped form does not hold for this call."""
    tensors = (x, weights, indices, out)
    if not (isinstance(experts, torch.nn.ModuleList) and 0 < n == len(experts)
            and all(isinstance(t, torch.Tensor) for t in tensors)
            and x.dim() == 2 and x.shape[0] > 0 and x.is_floating_point()
            and indices.dtype in (torch.int32, torch.int64) and indices.dim() == 2
            and weights.shape == indices.shape and indices.shape[0] == x.shape[0]
            and out.shape == x.shape and len({t.device for t in tensors}) == 1
            and len({t.untyped_storage().data_ptr() for t in tensors}) == 4
            and not torch.nn.modules.module._global_forward_hooks
            and not torch.nn.modules.module._global_forward_pre_hooks):
        return None  # (out sharing storage with an input: the loop reads what it added)
    if torch.is_grad_enabled() and any(p.requires_grad for p in experts[0].parameters()):
        return None  # the stack is made outside autograd: training runs the loop
    stacks = experts.__dict__.setdefault("_pike_stacks", {})
    key = (x.device, x.dtype)
    kept = stacks.get(key)
    if kept is not None and _still_viewed(experts, *kept):
        return kept[0]
    if kept is not None and kept[0] is None:
        return None
    stack = _built_stack(experts, x)
    stacks[key] = (stack, _pointers(experts) if stack is not None else None)
    return stack


def _pointers(experts):
    """What _still_viewed compares: the experts, their layers and weights as the stack was
    built, and where those weights' data was."""
    layers = [(expert, name, getattr(expert, name)) for expert in experts for name in _LAYERS]
    weights = [layer._parameters["weight"] for _, _, layer in layers]
    return (tuple(experts._modules.values()), layers, weights,
            [w.data_ptr() for w in weights])


def _still_viewed(experts, stack, pointers):
    """Every expert's weights are still the stack's views and nothing hooks them: checked
    at each call, as a weight or an expert may be replaced or hooked after the first. By
    identity and pointer, in one pass (about 40 us for 64 experts on a CPU core, where
    attribute lookups took 260)."""
    if stack is None:
        return False
    modules, layers, weights, data = pointers
    if tuple(experts._modules.values()) != modules:
        return False
    for (expert, name, layer), weight, at in zip(layers, weights, data):
        if (expert._modules.get(name) is not layer or layer._forward_hooks
                or layer._forward_pre_hooks or layer._parameters.get("weight") is not weight
                or weight.data_ptr() != at):
            return False
    return not any(e._forward_hooks or e._forward_pre_hooks for e in modules)


def _swiglu_weights(experts):
    """Each expert's (w1, w3, w2) weights, or None where the experts are not all of one
    class of three plain linear layers without bias or hooks (what the stack stands for;
    the probe checks the rest)."""
    found = []
    for expert in experts:
        layers = [getattr(expert, name, None) for name in _LAYERS]
        if type(expert) is not type(experts[0]) or expert._forward_hooks or (
                expert._forward_pre_hooks) or any(
                not isinstance(layer, torch.nn.Module) or layer._forward_hooks
                or layer._forward_pre_hooks or getattr(layer, "bias", None) is not None
                or not isinstance(getattr(layer, "weight", None), torch.Tensor)
                or layer.weight.dim() != 2 for layer in layers):
            return None
        found.append([layer.weight for layer in layers])
    return found


def _built_stack(experts, x):
    layers = _swiglu_weights(experts)
    if layers is None or any(w.dtype != x.dtype or w.device != x.device
                             for ws in layers for w in ws):
        return None
    shapes = {tuple(tuple(w.shape) for w in ws) for ws in layers}
    if len(shapes) != 1:
        return None
    (w1_shape, w3_shape, w2_shape), = shapes
    if not (w1_shape == w3_shape and w2_shape == w1_shape[::-1]
            and x.shape[1] == w1_shape[1]):
        return None
    # ordinary tensors outside autograd, whatever mode the call is in: the weights will
    # view them (inference_mode(False) turns grad mode on, so no_grad comes inside it)
    with torch.inference_mode(False), torch.no_grad():
        gate_up = torch.stack([torch.cat([w1, w3]) for w1, w3, _ in layers])
        down = torch.stack([w2 for _, _, w2 in layers])
        # every expert on the same two rows of its own (the input's may be zeros, which
        # any activation passes): another activation or layer form differs by far more
        # than the rounding of another product order
        seeded = torch.Generator(device=x.device).manual_seed(0)
        probe = torch.randn(2, x.shape[1], generator=seeded, device=x.device).to(x.dtype)
        hidden = torch.matmul(probe, gate_up.transpose(1, 2))
        gate, up = hidden.chunk(2, dim=-1)
        ours = torch.bmm(torch.nn.functional.silu(gate) * up, down.transpose(1, 2))
        for i, expert in enumerate(experts):
            theirs = expert(probe)
            if not (isinstance(theirs, torch.Tensor) and theirs.shape == ours[i].shape
                    and theirs.dtype == ours.dtype):
                return None
            scale = theirs.float().norm()
            if not bool((ours[i].float() - theirs.float()).norm() <= 1e-2 * scale + 1e-6):
                return None  # another activation or layer form: the loop as written
        inner = layers[0][0].shape[0]
        for i, expert in enumerate(experts):  # one copy of the weights, not two
            expert.w1.weight.data = gate_up[i, :inner]
            expert.w3.weight.data = gate_up[i, inner:]
            expert.w2.weight.data = down[i]
    return gate_up, down

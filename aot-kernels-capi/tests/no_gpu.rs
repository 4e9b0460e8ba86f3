//! The C ABI's paths that need no GPU, called as C calls them: argument errors name the argument,
//! a machine without a driver gets its own status, the last error belongs to its thread, the
//! simulated plan comes through the buffer protocol.
//!
//! The buffers here are made-up, aligned device addresses: the checks run before the backend is
//! looked at, so a call with a null backend reports a bad buffer first and, with good buffers,
//! the null backend.

use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};

use aot_kernels::dispatch::driver::driver_present;
use aot_kernels::ops::attention::attn_scratch_needs;
use aot_kernels::ops::gated_delta_net::GdnShape;
use aot_kernels::ops::moe::MoeShape;
use aot_kernels_capi::backend::{
    aot_backend_create, aot_backend_create_in_context, aot_backend_destroy,
};
use aot_kernels_capi::json::aot_plan_json_simulated;
use aot_kernels_capi::last_error::aot_last_error_message;
use aot_kernels_capi::ops::{
    aot_attention_decode_bf16, aot_attention_decode_workspace_bytes, aot_gdn_recurrent_bf16,
    aot_gdn_recurrent_workspace_bytes, aot_gemv_bf16, aot_moe_forward_bf16,
    aot_moe_forward_workspace_bytes, aot_rmsnorm_bf16, aot_sample_tokens,
    aot_sigmoid_gate_mul_bf16, aot_silu_and_mul_bf16,
};
use aot_kernels_capi::{
    AotAttentionDecode, AotBackend, AotGdn, AotMoe, AotSamplingParams, AotStatus,
};

fn last_error() -> String {
    // SAFETY: this thread's message, valid until its next call.
    unsafe { CStr::from_ptr(aot_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// Device addresses far apart, 256-byte aligned as cudaMalloc's are.
const X: u64 = 0x7f00_0000_0000;
const W: u64 = 0x7f00_1000_0000;
const OUT: u64 = 0x7f00_2000_0000;

fn rmsnorm(
    backend: *const AotBackend,
    out: u64,
    out_len: usize,
    x: u64,
    weight_len: usize,
) -> AotStatus {
    // SAFETY: no pointer is dereferenced before the checks this test exercises.
    unsafe {
        aot_rmsnorm_bf16(
            backend,
            null_mut(),
            out,
            out_len,
            x,
            4 * 64,
            W,
            weight_len,
            4,
            64,
            1e-6,
            0.0,
        )
    }
}

#[test]
fn without_a_driver_creating_a_backend_says_so() {
    let mut backend: *mut AotBackend = null_mut();
    // SAFETY: `backend` is storage for one pointer.
    let status = unsafe { aot_backend_create(0, 0, 0, &mut backend) };
    if driver_present() {
        // A GPU machine: the driver is there, so the status is never the no-driver one.
        assert_ne!(status, AotStatus::NoDriver, "{}", last_error());
        // SAFETY: null or the backend just made.
        assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
    } else {
        assert_eq!(status, AotStatus::NoDriver);
        let message = last_error();
        assert!(
            message.starts_with("aot_backend_create: no CUDA driver found"),
            "{message}"
        );
        assert!(backend.is_null(), "no backend is written on failure");
    }
}

#[test]
fn create_names_a_null_out_a_bad_policy_flags_and_ordinal_before_opening_the_driver() {
    // What a caller's uninitialised variable might hold: a failed create must overwrite it.
    let garbage = std::ptr::NonNull::<AotBackend>::dangling().as_ptr();
    let mut backend: *mut AotBackend;
    let cases: [(i32, u32, u32, bool, AotStatus, &str); 4] = [
        (
            0,
            0,
            0,
            false,
            AotStatus::NullArgument,
            "aot_backend_create: `out` is null: pass a valid pointer",
        ),
        (
            0,
            7,
            0,
            true,
            AotStatus::InvalidArgument,
            "aot_backend_create: `policy` 7 is not a policy",
        ),
        (
            0,
            0,
            0x10,
            true,
            AotStatus::InvalidArgument,
            "aot_backend_create: `flags` 0x10 has unknown bits 0x10",
        ),
        (
            -1,
            0,
            0,
            true,
            AotStatus::InvalidArgument,
            "aot_backend_create: `ordinal` -1 is negative",
        ),
    ];
    for (ordinal, policy, flags, with_out, want, text) in cases {
        backend = garbage;
        let out = if with_out {
            &mut backend as *mut _
        } else {
            null_mut()
        };
        // SAFETY: `out` is null or storage for one pointer.
        let status = unsafe { aot_backend_create(ordinal, policy, flags, out) };
        assert_eq!(status, want, "{text}");
        assert!(
            last_error().starts_with(text),
            "{} (want {text})",
            last_error()
        );
        assert!(
            backend.is_null() == with_out,
            "{text}: a failed create writes NULL to `*out`"
        );
    }
    backend = garbage;
    // SAFETY: the null context is refused before use.
    let status = unsafe { aot_backend_create_in_context(null_mut(), 0, 0, &mut backend) };
    assert_eq!(status, AotStatus::NullArgument);
    assert!(last_error().starts_with("aot_backend_create_in_context: `cu_context` is null: pass"));
    assert!(backend.is_null());
}

#[test]
fn destroying_null_is_a_no_op() {
    // SAFETY: null is accepted.
    assert_eq!(unsafe { aot_backend_destroy(null_mut()) }, AotStatus::Ok);
    assert_eq!(last_error(), "");
}

#[test]
fn rmsnorm_names_a_null_a_short_and_a_misaligned_buffer_then_the_null_backend() {
    assert_eq!(rmsnorm(null(), OUT, 256, 0, 64), AotStatus::NullArgument);
    assert!(
        last_error().starts_with("aot_rmsnorm_bf16: `x` is null: pass a valid pointer"),
        "{}",
        last_error()
    );

    assert_eq!(
        rmsnorm(null(), OUT, 256, X, 63),
        AotStatus::DeviceBufferTooSmall
    );
    assert_eq!(
        last_error(),
        "aot_rmsnorm_bf16: `weight` is declared 63 elements long; the shape (hidden 64) needs 64"
    );

    assert_eq!(rmsnorm(null(), OUT + 1, 256, X, 64), AotStatus::Misaligned);
    assert!(
        last_error().starts_with("aot_rmsnorm_bf16: `out` (0x7f0020000001) is not 2-byte aligned"),
        "{}",
        last_error()
    );

    assert_eq!(
        rmsnorm(null(), X + 2, 256, X, 64),
        AotStatus::InvalidArgument
    );
    assert!(
        last_error().contains("`out` and `x` overlap"),
        "{}",
        last_error()
    );

    assert_eq!(rmsnorm(null(), OUT, 256, X, 64), AotStatus::NullArgument);
    assert!(
        last_error().starts_with("aot_rmsnorm_bf16: `backend` is null: pass a valid pointer"),
        "{}",
        last_error()
    );
}

#[test]
fn rmsnorm_names_a_zero_shape_and_a_non_finite_eps() {
    // SAFETY: refused before any pointer is used.
    let zero = unsafe {
        aot_rmsnorm_bf16(
            null(),
            null_mut(),
            OUT,
            256,
            X,
            256,
            W,
            64,
            0,
            64,
            1e-6,
            0.0,
        )
    };
    assert_eq!(zero, AotStatus::InvalidArgument);
    assert_eq!(
        last_error(),
        "aot_rmsnorm_bf16: `rows` is 0: it must be at least 1"
    );
    // SAFETY: as above.
    let nan = unsafe {
        aot_rmsnorm_bf16(
            null(),
            null_mut(),
            OUT,
            256,
            X,
            256,
            W,
            64,
            4,
            64,
            f32::NAN,
            0.0,
        )
    };
    assert_eq!(nan, AotStatus::InvalidArgument);
    assert_eq!(
        last_error(),
        "aot_rmsnorm_bf16: `eps` NaN must be a finite number"
    );
}

#[test]
fn gemv_names_its_token_limit_its_vector_alignment_and_its_strides() {
    let gemv = |x: u64, ld_x: usize, m: usize, out_len: usize| {
        // SAFETY: refused before any pointer is used (null backend).
        unsafe {
            aot_gemv_bf16(
                null(),
                null_mut(),
                W,
                128 * 64,
                128,
                64,
                x,
                8 * 64,
                ld_x,
                m,
                OUT,
                out_len,
                128,
            )
        }
    };
    assert_eq!(gemv(X, 64, 9, 9 * 128), AotStatus::InvalidArgument);
    assert!(
        last_error().starts_with("aot_gemv_bf16: `m` 9: one GEMV takes 1..=8 token rows"),
        "{}",
        last_error()
    );
    assert_eq!(gemv(X + 8, 64, 2, 256), AotStatus::Misaligned);
    assert!(last_error().starts_with("aot_gemv_bf16: `x` (0x7f0000000008) is not 16-byte aligned (its kernel reads it in 16-byte vectors)"), "{}", last_error());
    assert_eq!(gemv(X, 60, 2, 256), AotStatus::InvalidArgument);
    assert!(
        last_error().starts_with("aot_gemv_bf16: `ld_x` 60 must be a multiple of 8"),
        "{}",
        last_error()
    );
    assert_eq!(gemv(X, 64, 2, 255), AotStatus::DeviceBufferTooSmall);
    assert_eq!(
        last_error(),
        "aot_gemv_bf16: `out` is declared 255 elements long; the shape (rows 2 of n 128 every ld_out 128) needs 256"
    );
    assert_eq!(gemv(X, 64, 2, 256), AotStatus::NullArgument);
    assert!(
        last_error().starts_with("aot_gemv_bf16: `backend` is null: pass a valid pointer"),
        "{}",
        last_error()
    );
}

#[test]
fn silu_and_mul_needs_vector_alignment_only_when_d_is_a_multiple_of_8() {
    // SAFETY: refused before any pointer is used (null backend).
    let silu = |input: u64, d: usize| unsafe {
        aot_silu_and_mul_bf16(null(), null_mut(), OUT, 4 * d, input, 8 * d, 4, d)
    };
    assert_eq!(silu(X + 2, 64), AotStatus::Misaligned);
    assert!(
        last_error().contains("`input` (0x7f0000000002) is not 16-byte aligned"),
        "{}",
        last_error()
    );
    assert_eq!(silu(X + 2, 63), AotStatus::NullArgument, "{}", last_error());
    assert!(
        last_error().starts_with("aot_silu_and_mul_bf16: `backend` is null: pass a valid pointer"),
        "{}",
        last_error()
    );
}

#[test]
fn sample_tokens_names_null_params_and_each_parameter_array() {
    let params = AotSamplingParams {
        temperature: 0x7f00_3000_0000,
        top_k: 0x7f00_3100_0000,
        top_p: 0x7f00_3200_0000,
        seed: 0x7f00_3300_0004,
        counter: 0x7f00_3400_0000,
        len: 2,
    };
    // SAFETY: refused before any pointer is used (null backend); `p` is null or one struct.
    let sample = |p: *const AotSamplingParams| unsafe {
        aot_sample_tokens(null(), null_mut(), OUT, 2, X, 2 * 1000, 2, 1000, 1000, p)
    };
    assert_eq!(sample(null()), AotStatus::NullArgument);
    assert!(
        last_error().starts_with("aot_sample_tokens: `params` is null: pass a valid pointer"),
        "{}",
        last_error()
    );
    assert_eq!(sample(&params), AotStatus::Misaligned);
    assert!(
        last_error().starts_with(
            "aot_sample_tokens: `params->seed` (0x7f0033000004) is not 8-byte aligned"
        ),
        "{}",
        last_error()
    );
    let short = AotSamplingParams {
        seed: 0x7f00_3300_0000,
        len: 1,
        ..params
    };
    assert_eq!(sample(&short), AotStatus::DeviceBufferTooSmall);
    assert!(
        last_error()
            .starts_with("aot_sample_tokens: `params->temperature` is declared 1 elements long"),
        "{}",
        last_error()
    );
}

/// A decode-attention launch whose every argument passes: 2 rows, 8 query heads over 2 KV heads of
/// 128, 4 cache blocks a slot; each buffer at its own made-up address.
fn attention_args() -> AotAttentionDecode {
    let (m, q_heads, kv_heads, head_dim) = (2, 8, 2, 128);
    let width = (q_heads + 2 * kv_heads) * head_dim;
    let block = kv_heads * 16 * head_dim;
    let mut workspace_bytes = 0;
    // SAFETY: one writable size_t.
    let status = unsafe {
        aot_attention_decode_workspace_bytes(m, q_heads, kv_heads, head_dim, &mut workspace_bytes)
    };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    let at = |i: u64| 0x7f00_0000_0000 + (i << 28);
    AotAttentionDecode {
        qkv: at(0),
        qkv_len: m * width,
        ld_qkv: width,
        q_norm: at(1),
        q_norm_len: head_dim,
        k_norm: at(2),
        k_norm_len: head_dim,
        cos_sin: at(3),
        cos_sin_len: 64 * head_dim,
        max_pos: 64,
        k_cache: at(4),
        k_cache_len: 8 * block,
        v_cache: at(5),
        v_cache_len: 8 * block,
        block_table: at(6),
        block_table_len: 2 * 4,
        ld_bt: 4,
        slot_of_row: at(7),
        slot_of_row_len: m,
        positions: at(8),
        positions_len: m,
        out: at(9),
        out_len: m * q_heads * head_dim,
        workspace: at(10),
        workspace_bytes,
        m,
        q_heads,
        kv_heads,
        head_dim,
        eps: 1e-6,
        weight_offset: 0.0,
    }
}

/// The launch with `args` (null backend: only the argument checks run), its status and message.
fn attention(args: *const AotAttentionDecode) -> (AotStatus, String) {
    // SAFETY: `args` is null or one struct; no device pointer is used (null backend).
    let status = unsafe { aot_attention_decode_bf16(null(), null_mut(), args) };
    (status, last_error())
}

#[test]
fn attention_decode_names_null_args_and_with_good_ones_the_null_backend() {
    assert_eq!(
        attention(null()),
        (
            AotStatus::NullArgument,
            "aot_attention_decode_bf16: `args` is null: pass a valid pointer".to_string()
        )
    );
    assert_eq!(
        attention(&attention_args()),
        (
            AotStatus::NullArgument,
            "aot_attention_decode_bf16: `backend` is null: pass a valid pointer".to_string()
        )
    );
}

#[test]
fn attention_decode_names_a_null_a_misaligned_and_a_short_buffer() {
    let good = attention_args();
    let cases = [
        (
            AotAttentionDecode { qkv: 0, ..good },
            AotStatus::NullArgument,
            "aot_attention_decode_bf16: `args->qkv` is null: pass a valid pointer",
        ),
        (
            AotAttentionDecode { positions: 0, ..good },
            AotStatus::NullArgument,
            "aot_attention_decode_bf16: `args->positions` is null: pass a valid pointer",
        ),
        (
            AotAttentionDecode { k_cache: good.k_cache + 8, ..good },
            AotStatus::Misaligned,
            "aot_attention_decode_bf16: `args->k_cache` (0x7f0040000008) is not 16-byte aligned (its kernel reads it in 16-byte vectors)",
        ),
        (
            AotAttentionDecode { cos_sin: good.cos_sin + 2, ..good },
            AotStatus::Misaligned,
            "aot_attention_decode_bf16: `args->cos_sin` (0x7f0030000002) is not 4-byte aligned (the size of its element)",
        ),
        (
            AotAttentionDecode { out_len: good.out_len - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_attention_decode_bf16: `args->out` is declared 2047 elements long; the shape (m 2 x q_heads 8 x head_dim 128) needs 2048",
        ),
        (
            AotAttentionDecode { qkv_len: 2 * 1536 - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_attention_decode_bf16: `args->qkv` is declared 3071 elements long",
        ),
        (
            AotAttentionDecode { cos_sin_len: 63 * 128, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_attention_decode_bf16: `args->cos_sin` is declared 8064 elements long; the shape (max_pos 64 x head_dim 128) needs 8192",
        ),
    ];
    for (args, status, text) in cases {
        let (got, message) = attention(&args);
        assert_eq!(got, status, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

#[test]
fn attention_decode_names_a_head_dim_the_kernel_lacks_and_a_group_it_cannot_form() {
    let good = attention_args();
    let cases = [
        (
            AotAttentionDecode { head_dim: 96, ..good },
            "aot_attention_decode_bf16: `args->head_dim` 96: the kernel is built for 64, 128 and 256",
        ),
        (
            AotAttentionDecode { q_heads: 7, ..good },
            "aot_attention_decode_bf16: `args->q_heads` 7 over `args->kv_heads` 2: each KV head serves 1..=8 query heads",
        ),
        (
            AotAttentionDecode { q_heads: 18, ..good },
            "aot_attention_decode_bf16: `args->q_heads` 18 over `args->kv_heads` 2",
        ),
        (
            AotAttentionDecode { m: 0, ..good },
            "aot_attention_decode_bf16: `args->m` 0 must be 1..=65535",
        ),
        (
            AotAttentionDecode { ld_qkv: 1535, ..good },
            "aot_attention_decode_bf16: `args->ld_qkv` 1535 is below the row width",
        ),
        (
            AotAttentionDecode { eps: -1.0, ..good },
            "aot_attention_decode_bf16: `args->eps` -1 must be >= 0",
        ),
    ];
    for (args, text) in cases {
        let (got, message) = attention(&args);
        assert_eq!(got, AotStatus::InvalidArgument, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

#[test]
fn attention_decode_names_a_workspace_too_small_or_not_8_byte_aligned() {
    let good = attention_args();
    let (status, message) = attention(&AotAttentionDecode {
        workspace_bytes: good.workspace_bytes - 1,
        ..good
    });
    assert_eq!(status, AotStatus::DeviceBufferTooSmall, "{message}");
    assert_eq!(
        message,
        format!(
            "aot_attention_decode_bf16: `args->workspace` is declared {} elements long; the shape (aot_attention_decode_workspace_bytes of m 2, q_heads 8, kv_heads 2, head_dim 128) needs {}",
            good.workspace_bytes - 1,
            good.workspace_bytes
        )
    );
    let (status, message) = attention(&AotAttentionDecode {
        workspace: good.workspace + 4,
        ..good
    });
    assert_eq!(status, AotStatus::Misaligned, "{message}");
    assert!(
        message.contains("`args->workspace` (0x7f00a0000004) is not 8-byte aligned (its kernel reads it in 8-byte vectors)"),
        "{message}"
    );
}

#[test]
fn attention_decode_names_a_written_buffer_overlapping_another() {
    let good = attention_args();
    let cases = [
        (
            AotAttentionDecode {
                out: good.qkv + 64,
                ..good
            },
            "`args->out` and `args->qkv` overlap",
        ),
        (
            AotAttentionDecode {
                v_cache: good.k_cache + 4096,
                ..good
            },
            "`args->k_cache` and `args->v_cache` overlap",
        ),
        (
            AotAttentionDecode {
                workspace: good.block_table,
                ..good
            },
            "`args->workspace` and `args->block_table` overlap",
        ),
    ];
    for (args, text) in cases {
        let (got, message) = attention(&args);
        assert_eq!(got, AotStatus::InvalidArgument, "{message}");
        assert!(message.contains(text), "{message} (want {text})");
    }
    // Buffers it only reads may share bytes: one norm weight for queries and keys.
    let shared = AotAttentionDecode {
        k_norm: good.q_norm,
        ..good
    };
    assert_eq!(
        attention(&shared).1,
        "aot_attention_decode_bf16: `backend` is null: pass a valid pointer"
    );
}

#[test]
fn attention_workspace_bytes_is_the_backends_scratch_and_names_bad_heads_and_a_null_out() {
    let mut bytes = 0usize;
    // SAFETY: one writable size_t.
    let status = unsafe { aot_attention_decode_workspace_bytes(8, 32, 8, 128, &mut bytes) };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    let (ml, o, counters) = attn_scratch_needs(8, 32, 8, 128);
    assert_eq!(bytes, 4 * (ml + o + counters));

    // SAFETY: as above.
    let status = unsafe { aot_attention_decode_workspace_bytes(8, 32, 8, 80, &mut bytes) };
    assert_eq!(status, AotStatus::InvalidArgument);
    assert_eq!(
        last_error(),
        "aot_attention_decode_workspace_bytes: `head_dim` 80: the kernel is built for 64, 128 and 256"
    );
    // SAFETY: as above.
    let status = unsafe { aot_attention_decode_workspace_bytes(8, 12, 8, 128, &mut bytes) };
    assert_eq!(status, AotStatus::InvalidArgument);
    assert!(
        last_error()
            .starts_with("aot_attention_decode_workspace_bytes: `q_heads` 12 over `kv_heads` 8"),
        "{}",
        last_error()
    );
    // SAFETY: a null `bytes` is refused.
    let status = unsafe { aot_attention_decode_workspace_bytes(8, 32, 8, 128, null_mut()) };
    assert_eq!(status, AotStatus::NullArgument);
    assert_eq!(
        last_error(),
        "aot_attention_decode_workspace_bytes: `bytes` is null: pass a valid pointer"
    );
}

/// The output gate with made-up buffers (null backend), its status and message.
fn sigmoid_gate(x: u64, x_len: usize, ld_x: usize, gate: u64, rows: usize) -> (AotStatus, String) {
    // SAFETY: no pointer is dereferenced before the checks this test exercises.
    let status = unsafe {
        aot_sigmoid_gate_mul_bf16(
            null(),
            null_mut(),
            x,
            x_len,
            ld_x,
            gate,
            4 * 96,
            96,
            rows,
            64,
        )
    };
    (status, last_error())
}

#[test]
fn sigmoid_gate_names_a_null_a_misaligned_a_short_and_an_overlapping_buffer() {
    let cases = [
        (0, 256, 64, W, 4, AotStatus::NullArgument, "aot_sigmoid_gate_mul_bf16: `x` is null: pass a valid pointer"),
        (
            X + 1,
            256,
            64,
            W,
            4,
            AotStatus::Misaligned,
            "aot_sigmoid_gate_mul_bf16: `x` (0x7f0000000001) is not 2-byte aligned",
        ),
        (
            X,
            3 * 128 + 63,
            128,
            W,
            4,
            AotStatus::DeviceBufferTooSmall,
            "aot_sigmoid_gate_mul_bf16: `x` is declared 447 elements long; the shape (rows 4 of width 64 every ld_x 128) needs 448",
        ),
        (
            X,
            256,
            64,
            X + 64,
            4,
            AotStatus::InvalidArgument,
            "aot_sigmoid_gate_mul_bf16: `x` and `gate` overlap",
        ),
        (
            X,
            256,
            32,
            W,
            4,
            AotStatus::InvalidArgument,
            "aot_sigmoid_gate_mul_bf16: `ld_x` 32 is below the row width width 64",
        ),
        (
            X,
            256,
            64,
            W,
            0,
            AotStatus::InvalidArgument,
            "aot_sigmoid_gate_mul_bf16: `rows` 0 must be 1..=65535",
        ),
        (X, 256, 64, W, 4, AotStatus::NullArgument, "aot_sigmoid_gate_mul_bf16: `backend` is null: pass a valid pointer"),
    ];
    for (x, x_len, ld_x, gate, rows, status, text) in cases {
        let (got, message) = sigmoid_gate(x, x_len, ld_x, gate, rows);
        assert_eq!(got, status, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

/// A well-formed GDN launch on made-up addresses: 3 sequences of 5 tokens, 4 slots.
fn gdn_args() -> AotGdn {
    let s = GdnShape::QWEN3_5_A3B;
    let (n, n_seqs, slots) = (5, 3, 4);
    let mut workspace_bytes = 0;
    // SAFETY: one writable size_t.
    let status = unsafe {
        aot_gdn_recurrent_workspace_bytes(
            n,
            s.key_heads,
            s.value_heads,
            s.key_dim,
            s.value_dim,
            s.conv_width,
            &mut workspace_bytes,
        )
    };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    let at = |i: u64| 0x7f00_0000_0000 + (i << 28);
    AotGdn {
        qkv: at(0),
        qkv_len: n * s.conv_dim(),
        a: at(1),
        a_len: n * s.value_heads,
        b: at(2),
        b_len: n * s.value_heads,
        z: at(3),
        z_len: n * s.value_width(),
        conv_weight: at(4),
        conv_weight_len: s.conv_dim() * s.conv_width,
        a_log: at(5),
        a_log_len: s.value_heads,
        dt_bias: at(6),
        dt_bias_len: s.value_heads,
        norm_weight: at(7),
        norm_weight_len: s.value_dim,
        conv_state: at(8),
        conv_state_len: slots * s.conv_state_len(),
        recurrent_state: at(9),
        recurrent_state_len: slots * s.recurrent_state_len(),
        state_slots: slots,
        cu_seqlens: at(10),
        cu_seqlens_len: n_seqs + 1,
        slot_of_seq: at(11),
        slot_of_seq_len: n_seqs,
        has_state: at(12),
        has_state_len: n_seqs,
        out: at(13),
        out_len: n * s.value_width(),
        workspace: at(14),
        workspace_bytes,
        n_seqs,
        n_tokens: n,
        key_heads: s.key_heads,
        value_heads: s.value_heads,
        key_dim: s.key_dim,
        value_dim: s.value_dim,
        conv_width: s.conv_width,
        eps: 1e-6,
    }
}

/// The GDN launch with `args` (null backend: only the argument checks run).
fn gdn(args: *const AotGdn) -> (AotStatus, String) {
    // SAFETY: `args` is null or one struct; no device pointer is used (null backend).
    let status = unsafe { aot_gdn_recurrent_bf16(null(), null_mut(), args) };
    (status, last_error())
}

#[test]
fn gdn_names_null_args_and_with_good_ones_the_null_backend() {
    assert_eq!(
        gdn(null()),
        (
            AotStatus::NullArgument,
            "aot_gdn_recurrent_bf16: `args` is null: pass a valid pointer".to_string()
        )
    );
    assert_eq!(
        gdn(&gdn_args()),
        (
            AotStatus::NullArgument,
            "aot_gdn_recurrent_bf16: `backend` is null: pass a valid pointer".to_string()
        )
    );
}

#[test]
fn gdn_names_a_null_a_misaligned_a_short_and_an_overlapping_buffer() {
    let good = gdn_args();
    let cases = [
        (
            AotGdn { qkv: 0, ..good },
            AotStatus::NullArgument,
            "aot_gdn_recurrent_bf16: `args->qkv` is null: pass a valid pointer",
        ),
        (
            AotGdn { has_state: 0, ..good },
            AotStatus::NullArgument,
            "aot_gdn_recurrent_bf16: `args->has_state` is null: pass a valid pointer",
        ),
        (
            AotGdn { a_log: good.a_log + 4, ..good },
            AotStatus::Misaligned,
            "aot_gdn_recurrent_bf16: `args->a_log` (0x7f0050000004) is not 16-byte aligned",
        ),
        (
            AotGdn { recurrent_state_len: good.recurrent_state_len - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_gdn_recurrent_bf16: `args->recurrent_state` is declared 2097151 elements long; the shape (state_slots 4 x value_heads 32 x key_dim 128 x value_dim 128) needs 2097152",
        ),
        (
            AotGdn { cu_seqlens_len: 3, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_gdn_recurrent_bf16: `args->cu_seqlens` is declared 3 elements long; the shape (n_seqs + 1 4) needs 4",
        ),
        (
            AotGdn { workspace_bytes: good.workspace_bytes - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_gdn_recurrent_bf16: `args->workspace` is declared 81919 elements long; the shape (aot_gdn_recurrent_workspace_bytes of n_tokens 5) needs 81920",
        ),
        (
            AotGdn { out: good.z, ..good },
            AotStatus::InvalidArgument,
            "aot_gdn_recurrent_bf16: `args->out` and `args->z` overlap",
        ),
        (
            AotGdn { recurrent_state: good.conv_state + 16, ..good },
            AotStatus::InvalidArgument,
            "aot_gdn_recurrent_bf16: `args->conv_state` and `args->recurrent_state` overlap",
        ),
    ];
    for (args, status, text) in cases {
        let (got, message) = gdn(&args);
        assert_eq!(got, status, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
    // Buffers it only reads may share bytes: a and b from one fused projection, say.
    assert_eq!(
        gdn(&AotGdn { b: good.a, ..good }).1,
        "aot_gdn_recurrent_bf16: `backend` is null: pass a valid pointer"
    );
}

#[test]
fn gdn_names_a_shape_the_kernels_lack_and_a_bad_batch() {
    let good = gdn_args();
    let cases = [
        (
            AotGdn { value_heads: 8, ..good },
            "aot_gdn_recurrent_bf16: `args->value_heads` 8: the `gdn_recurrent` kernels are built for 32 only",
        ),
        (
            AotGdn { key_dim: 64, ..good },
            "aot_gdn_recurrent_bf16: `args->key_dim` 64: the `gdn_recurrent` kernels are built for 128 only",
        ),
        (
            AotGdn { n_seqs: 6, ..good },
            "aot_gdn_recurrent_bf16: `args->n_seqs` 6 must be 1..=`args->n_tokens` 5",
        ),
        (
            AotGdn { n_tokens: 0, ..good },
            "aot_gdn_recurrent_bf16: `args->n_tokens` 0 must be 1..2^31",
        ),
        (
            AotGdn { state_slots: 0, ..good },
            "aot_gdn_recurrent_bf16: `args->state_slots` is 0: it must be at least 1",
        ),
        (
            AotGdn { eps: 0.0, ..good },
            "aot_gdn_recurrent_bf16: `args->eps` 0 must be > 0",
        ),
    ];
    for (args, text) in cases {
        let (got, message) = gdn(&args);
        assert_eq!(got, AotStatus::InvalidArgument, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

#[test]
fn gdn_workspace_bytes_is_the_conv_output_and_names_a_bad_shape_and_a_null_out() {
    let s = GdnShape::QWEN3_5_A3B;
    let query = |tokens, key_heads, bytes: *mut usize| {
        // SAFETY: `bytes` is null or one writable size_t.
        unsafe {
            aot_gdn_recurrent_workspace_bytes(
                tokens,
                key_heads,
                s.value_heads,
                s.key_dim,
                s.value_dim,
                s.conv_width,
                bytes,
            )
        }
    };
    let mut bytes = 0usize;
    assert_eq!(
        query(7, s.key_heads, &mut bytes),
        AotStatus::Ok,
        "{}",
        last_error()
    );
    assert_eq!(bytes, 2 * 7 * s.conv_dim());
    assert_eq!(query(7, 4, &mut bytes), AotStatus::InvalidArgument);
    assert_eq!(
        last_error(),
        "aot_gdn_recurrent_workspace_bytes: `key_heads` 4: the `gdn_recurrent` kernels are built for 16 only (the Qwen3.5/3.6-35B-A3B shape)"
    );
    assert_eq!(query(7, s.key_heads, null_mut()), AotStatus::NullArgument);
    assert_eq!(
        last_error(),
        "aot_gdn_recurrent_workspace_bytes: `bytes` is null: pass a valid pointer"
    );
}

/// A well-formed MoE launch on made-up addresses: 3 tokens.
fn moe_args() -> AotMoe {
    let s = MoeShape::QWEN3_5_A3B;
    let (n, h, e, i) = (3, s.hidden, s.experts, s.inter);
    let mut workspace_bytes = 0;
    // SAFETY: one writable size_t.
    let status =
        unsafe { aot_moe_forward_workspace_bytes(n, h, e, s.top_k, i, &mut workspace_bytes) };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    let at = |k: u64| 0x7f00_0000_0000 + (k << 32);
    AotMoe {
        x: at(0),
        x_len: n * h,
        router: at(1),
        router_len: e * h,
        shared_gate: at(2),
        shared_gate_len: h,
        gate_up: at(3),
        gate_up_len: e * 2 * i * h,
        down: at(4),
        down_len: e * h * i,
        shared_gate_up: at(5),
        shared_gate_up_len: 2 * i * h,
        shared_down: at(6),
        shared_down_len: h * i,
        out: at(7),
        out_len: n * h,
        workspace: at(8),
        workspace_bytes,
        n_tokens: n,
        hidden: h,
        experts: e,
        top_k: s.top_k,
        inter: i,
    }
}

/// The MoE launch with `args` (null backend: only the argument checks run).
fn moe(args: *const AotMoe) -> (AotStatus, String) {
    // SAFETY: `args` is null or one struct; no device pointer is used (null backend).
    let status = unsafe { aot_moe_forward_bf16(null(), null_mut(), args) };
    (status, last_error())
}

#[test]
fn moe_names_null_args_and_with_good_ones_the_null_backend() {
    assert_eq!(
        moe(null()),
        (
            AotStatus::NullArgument,
            "aot_moe_forward_bf16: `args` is null: pass a valid pointer".to_string()
        )
    );
    assert_eq!(
        moe(&moe_args()),
        (
            AotStatus::NullArgument,
            "aot_moe_forward_bf16: `backend` is null: pass a valid pointer".to_string()
        )
    );
}

#[test]
fn moe_names_a_null_a_misaligned_a_short_and_an_overlapping_buffer() {
    let good = moe_args();
    let cases = [
        (
            AotMoe { router: 0, ..good },
            AotStatus::NullArgument,
            "aot_moe_forward_bf16: `args->router` is null: pass a valid pointer",
        ),
        (
            AotMoe { x: good.x + 8, ..good },
            AotStatus::Misaligned,
            "aot_moe_forward_bf16: `args->x` (0x7f0000000008) is not 16-byte aligned",
        ),
        (
            AotMoe { down_len: good.down_len - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_moe_forward_bf16: `args->down` is declared 268435455 elements long; the shape (experts 256 x hidden 2048 x inter 512) needs 268435456",
        ),
        (
            AotMoe { workspace_bytes: good.workspace_bytes - 1, ..good },
            AotStatus::DeviceBufferTooSmall,
            "aot_moe_forward_bf16: `args->workspace` is declared",
        ),
        (
            AotMoe { workspace: good.x, ..good },
            AotStatus::InvalidArgument,
            "aot_moe_forward_bf16: `args->workspace` and `args->x` overlap",
        ),
        (
            AotMoe { out: good.workspace + 16, ..good },
            AotStatus::InvalidArgument,
            "aot_moe_forward_bf16: `args->out` and `args->workspace` overlap",
        ),
    ];
    for (args, status, text) in cases {
        let (got, message) = moe(&args);
        assert_eq!(got, status, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

#[test]
fn moe_names_a_shape_the_kernels_lack_and_too_many_tokens() {
    let good = moe_args();
    let cases = [
        (
            AotMoe { experts: 16, ..good },
            "aot_moe_forward_bf16: `args->experts` 16: the `moe_router` kernels are built for 256 only",
        ),
        (
            AotMoe { top_k: 2, ..good },
            "aot_moe_forward_bf16: `args->top_k` 2: the `moe_route` kernels are built for 8 only",
        ),
        (
            AotMoe { n_tokens: 17, ..good },
            "aot_moe_forward_bf16: `args->n_tokens` 17: the kernels take 1..=16 tokens a launch",
        ),
    ];
    for (args, text) in cases {
        let (got, message) = moe(&args);
        assert_eq!(got, AotStatus::InvalidArgument, "{message}");
        assert!(message.starts_with(text), "{message} (want {text})");
    }
}

#[test]
fn moe_workspace_bytes_grows_with_the_tokens_and_names_a_bad_shape_and_a_null_out() {
    let s = MoeShape::QWEN3_5_A3B;
    let query = |tokens, inter, bytes: *mut usize| {
        // SAFETY: `bytes` is null or one writable size_t.
        unsafe {
            aot_moe_forward_workspace_bytes(tokens, s.hidden, s.experts, s.top_k, inter, bytes)
        }
    };
    let (mut one, mut sixteen) = (0usize, 0usize);
    assert_eq!(
        query(1, s.inter, &mut one),
        AotStatus::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        query(16, s.inter, &mut sixteen),
        AotStatus::Ok,
        "{}",
        last_error()
    );
    // At least the intermediates `h` and `y` of every (token, expert) pair and the shared expert.
    let rows = 16 * (s.top_k + 1);
    assert!(
        sixteen >= 2 * rows * (s.inter + s.hidden) && sixteen > one,
        "{one} {sixteen}"
    );
    assert_eq!(query(1, 256, &mut one), AotStatus::InvalidArgument);
    assert!(
        last_error().starts_with("aot_moe_forward_workspace_bytes: `inter` 256: the `moe_gate_up` kernels are built for 512"),
        "{}",
        last_error()
    );
    assert_eq!(query(1, s.inter, null_mut()), AotStatus::NullArgument);
    assert_eq!(
        last_error(),
        "aot_moe_forward_workspace_bytes: `bytes` is null: pass a valid pointer"
    );
}

#[test]
fn each_thread_reads_its_own_last_error() {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let fail_then_read = |null_x: bool, barrier: std::sync::Arc<std::sync::Barrier>| {
        std::thread::spawn(move || {
            let status = if null_x {
                rmsnorm(null(), OUT, 256, 0, 64)
            } else {
                rmsnorm(null(), OUT, 256, X, 63)
            };
            assert_ne!(status, AotStatus::Ok);
            // Both threads have failed before either reads.
            barrier.wait();
            last_error()
        })
    };
    let a = fail_then_read(true, barrier.clone());
    let b = fail_then_read(false, barrier);
    assert!(a
        .join()
        .unwrap()
        .starts_with("aot_rmsnorm_bf16: `x` is null: pass a valid pointer"));
    assert!(b
        .join()
        .unwrap()
        .contains("`weight` is declared 63 elements long"));
}

#[test]
fn the_simulated_plan_comes_through_the_buffer_protocol() {
    let mut len = 0usize;
    // SAFETY: a null buffer with capacity 0 asks for the size.
    let status = unsafe { aot_plan_json_simulated(9, 0, 13, 0, 0, 0, null_mut(), &mut len) };
    assert_eq!(status, AotStatus::HostBufferTooSmall, "{}", last_error());
    assert!(len > 2, "the size needed is reported");
    let mut buf = vec![0 as c_char; len];
    let mut cap = len;
    // SAFETY: `buf` holds `cap` bytes.
    let status = unsafe { aot_plan_json_simulated(9, 0, 13, 0, 0, 0, buf.as_mut_ptr(), &mut cap) };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    assert_eq!(cap, len);
    // SAFETY: NUL-terminated by the call.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    let plan: serde_json::Value = serde_json::from_str(text).expect("the plan is JSON");
    let modules = plan["modules"].as_array().expect("a modules array");
    assert!(modules.iter().any(|m| m["module"] == "rmsnorm"), "{text}");

    let mut small = 4usize;
    let mut four = [0 as c_char; 4];
    // SAFETY: `four` holds `small` bytes.
    let status =
        unsafe { aot_plan_json_simulated(9, 0, 13, 0, 0, 0, four.as_mut_ptr(), &mut small) };
    assert_eq!(status, AotStatus::HostBufferTooSmall);
    assert_eq!(small, len);
    assert_eq!(four, [0; 4], "nothing is written to a short buffer");

    // A minor of two digits would alias another architecture (12.10 as sm_130): refused.
    for (args, name) in [
        ((12, 10, 13, 0), "`minor` 10"),
        ((9, 0, 13, 12), "`driver_minor` 12"),
    ] {
        let (major, minor, dmaj, dmin) = args;
        // SAFETY: refused before the buffer is used.
        let status = unsafe {
            aot_plan_json_simulated(major, minor, dmaj, dmin, 0, 0, null_mut(), &mut len)
        };
        assert_eq!(status, AotStatus::InvalidArgument);
        assert!(last_error().contains(name), "{}", last_error());
    }
    // SAFETY: refused before the buffer is used.
    let status = unsafe { aot_plan_json_simulated(9, 0, 13, 0, 2, 0, null_mut(), &mut len) };
    assert_eq!(status, AotStatus::InvalidArgument);
    assert!(
        last_error().contains("`integrated` 2 must be 0"),
        "{}",
        last_error()
    );
    // SAFETY: a null `len` is refused.
    let status = unsafe { aot_plan_json_simulated(9, 0, 13, 0, 0, 0, null_mut(), null_mut()) };
    assert_eq!(status, AotStatus::NullArgument);
    assert!(
        last_error().starts_with("aot_plan_json_simulated: `len` is null: pass a valid pointer"),
        "{}",
        last_error()
    );
}

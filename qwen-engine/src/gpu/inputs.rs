//! A decode pass's inputs as the device holds them: every row's token, position, slot and
//! sampling parameters side by side in one allocation of [`WORDS`] 64-bit words, which one copy
//! from page-locked memory fills (instead of eight small copies from pageable memory, each a
//! separate operation on the stream before the pass could start).
//!
//! Layout, in words (eight values of each field, rows past the pass's count left as they were):
//!
//! ```text
//! tokens       i32 x 8   words  0..4    (first: a pass launched ahead copies the previous
//! positions    i32 x 8   words  4..8     pass's sampled tokens over them)
//! slots        i32 x 8   words  8..12
//! temperature  f32 x 8   words 12..16
//! top_k        u32 x 8   words 16..20
//! top_p        f32 x 8   words 20..24
//! seed         u64 x 8   words 24..32
//! counter      u64 x 8   words 32..40
//! ```

use aot_kernels::device::{CudaSlice, CudaView, CudaViewMut};
use aot_kernels::ops::gemv::MAX_TOKENS;
use aot_kernels::ops::sampling::SamplingParams;

use super::Row;

#[cfg(target_endian = "big")]
compile_error!(
    "the pass inputs pack 32-bit values into words little-endian, as the GPU reads them"
);

const ROWS: usize = 8;
const _: () = assert!(MAX_TOKENS == ROWS, "a pass's inputs hold eight rows");

/// 64-bit words of one pass's inputs.
pub(crate) const WORDS: usize = 40;

const TOKENS: usize = 0;
const POSITIONS: usize = 4;
const SLOTS: usize = 8;
const TEMPERATURE: usize = 12;
const TOP_K: usize = 16;
const TOP_P: usize = 20;
const SEED: usize = 24;
const COUNTER: usize = 32;

/// Writes 32-bit value `i` of the field at word `base`.
fn put32(words: &mut [u64], base: usize, i: usize, v: u32) {
    let w = &mut words[base + i / 2];
    let shift = 32 * (i % 2);
    *w = (*w & !(0xffff_ffffu64 << shift)) | (u64::from(v) << shift);
}

/// Packs `rows` (at most eight) into `words`. A row without a sample request takes the greedy
/// parameters (what it samples is ignored). Rows past `rows.len()` keep what they held.
pub(crate) fn pack(rows: &[Row], words: &mut [u64]) {
    assert!(rows.len() <= ROWS && words.len() >= WORDS);
    for (i, r) in rows.iter().enumerate() {
        let (params, seed, counter) = r.sample.map_or((SamplingParams::GREEDY, 0, 0), |s| {
            (s.params, s.seed, s.counter)
        });
        put32(words, TOKENS, i, r.token);
        put32(words, POSITIONS, i, r.pos as u32);
        put32(words, SLOTS, i, r.slot as u32);
        put32(words, TEMPERATURE, i, params.temperature.to_bits());
        put32(words, TOP_K, i, params.top_k);
        put32(words, TOP_P, i, params.top_p.to_bits());
        words[SEED + i] = seed;
        words[COUNTER + i] = counter;
    }
}

/// The eight values of the 32-bit field at word `base`.
fn view32<T>(inputs: &CudaSlice<u64>, base: usize) -> CudaView<'_, T> {
    // SAFETY: four words hold eight 32-bit values of a plain type (i32, u32, f32), every bit
    // pattern of which is valid.
    unsafe { inputs.slice(base..base + ROWS / 2).transmute::<T>(ROWS) }
        .expect("four words hold eight 32-bit values")
}

fn view64(inputs: &CudaSlice<u64>, base: usize) -> CudaView<'_, u64> {
    inputs.slice(base..base + ROWS)
}

pub(crate) fn tokens(inputs: &CudaSlice<u64>) -> CudaView<'_, i32> {
    view32(inputs, TOKENS)
}

/// The first `m` tokens, writable (a pass launched ahead copies its tokens there on the device).
pub(crate) fn tokens_mut(inputs: &mut CudaSlice<u64>, m: usize) -> CudaViewMut<'_, i32> {
    assert!(m <= ROWS);
    // SAFETY: the first four words hold the eight i32 tokens.
    unsafe { inputs.transmute_mut::<i32>(m) }.expect("the inputs hold eight tokens")
}

pub(crate) fn positions(inputs: &CudaSlice<u64>) -> CudaView<'_, i32> {
    view32(inputs, POSITIONS)
}

pub(crate) fn slots(inputs: &CudaSlice<u64>) -> CudaView<'_, i32> {
    view32(inputs, SLOTS)
}

pub(crate) fn temperature(inputs: &CudaSlice<u64>) -> CudaView<'_, f32> {
    view32(inputs, TEMPERATURE)
}

pub(crate) fn top_k(inputs: &CudaSlice<u64>) -> CudaView<'_, u32> {
    view32(inputs, TOP_K)
}

pub(crate) fn top_p(inputs: &CudaSlice<u64>) -> CudaView<'_, f32> {
    view32(inputs, TOP_P)
}

pub(crate) fn seed(inputs: &CudaSlice<u64>) -> CudaView<'_, u64> {
    view64(inputs, SEED)
}

pub(crate) fn counter(inputs: &CudaSlice<u64>) -> CudaView<'_, u64> {
    view64(inputs, COUNTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::SampleRequest;

    /// The 32-bit value `i` of the field at `base`, read back as the GPU reads it (little-endian
    /// bytes of the words).
    fn get32(words: &[u64], base: usize, i: usize) -> u32 {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let at = base * 8 + i * 4;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn every_field_lands_in_its_words_as_little_endian_bytes() {
        let rows: Vec<Row> = (0..7)
            .map(|i| Row {
                token: 1000 + i as u32,
                pos: 17 * i + 3,
                slot: 7 - i,
                sample: (i != 2).then_some(SampleRequest {
                    params: SamplingParams {
                        temperature: 0.5 + i as f32,
                        top_k: 20 + i as u32,
                        top_p: 0.25 * (i % 4) as f32,
                    },
                    seed: (i as u64) << 40 | 9,
                    counter: 100 + i as u64,
                }),
            })
            .collect();
        let mut words = vec![u64::MAX; WORDS];
        pack(&rows, &mut words);
        for (i, r) in rows.iter().enumerate() {
            let (p, seed, counter) = r.sample.map_or((SamplingParams::GREEDY, 0, 0), |s| {
                (s.params, s.seed, s.counter)
            });
            assert_eq!(get32(&words, TOKENS, i), r.token);
            assert_eq!(get32(&words, POSITIONS, i) as usize, r.pos);
            assert_eq!(get32(&words, SLOTS, i) as usize, r.slot);
            assert_eq!(f32::from_bits(get32(&words, TEMPERATURE, i)), p.temperature);
            assert_eq!(get32(&words, TOP_K, i), p.top_k);
            assert_eq!(f32::from_bits(get32(&words, TOP_P, i)), p.top_p);
            assert_eq!(words[SEED + i], seed);
            assert_eq!(words[COUNTER + i], counter);
        }
        // The eighth row was not in the pass: its values are as they were.
        for base in [TOKENS, POSITIONS, SLOTS, TEMPERATURE, TOP_K, TOP_P] {
            assert_eq!(get32(&words, base, 7), u32::MAX);
        }
        assert_eq!((words[SEED + 7], words[COUNTER + 7]), (u64::MAX, u64::MAX));
    }

    #[test]
    fn the_fields_tile_the_words_without_overlap() {
        let fields = [
            (TOKENS, 4),
            (POSITIONS, 4),
            (SLOTS, 4),
            (TEMPERATURE, 4),
            (TOP_K, 4),
            (TOP_P, 4),
            (SEED, 8),
            (COUNTER, 8),
        ];
        let mut used = [false; WORDS];
        for (base, n) in fields {
            for w in &mut used[base..base + n] {
                assert!(!*w, "word used twice");
                *w = true;
            }
        }
        assert!(used.iter().all(|&u| u));
        assert_eq!(TOKENS, 0, "tokens_mut views the first words");
    }
}

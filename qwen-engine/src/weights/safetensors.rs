//! Loading a Hugging Face checkpoint: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists, memory-mapped and checked against the tensor table.
//!
//! The header is parsed here rather than by the `safetensors` crate so that every error names the
//! file, the tensor and the fix. Every byte is hostile: the header length, the JSON, each
//! tensor's offsets (past the end, overlapping, a length that disagrees with shape and dtype) and
//! the index's shard names are checked before anything is read through them.
//!
//! Policy for tensors the table does not list: the family names what a checkpoint may carry that
//! the model does not read (a tied checkpoint's `lm_head.weight`, saved rotary buffers, a hybrid
//! checkpoint's vision tower and `mtp.*` head: `ModelConfig::ignorable_tensor`); any other extra
//! tensor is refused, because it means the checkpoint is another architecture or variant (biases,
//! quantisation scales, more layers than config.json says) that this model would silently compute
//! wrong. A table entry with `parts` (fused experts) is read whole, or stacked from its parts
//! (experts stored one by one).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::{HostTensor, LoadedWeights, TensorData};
use crate::model::{ModelConfig, TensorSpec};

/// The single-file checkpoint name and the index of a sharded one.
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Headers larger than this are refused (the safetensors format's own limit).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Models at least this large show a progress bar while loading (when stderr is a terminal).
const PROGRESS_MIN_BYTES: usize = 64 << 20;

/// What the fix is when a file's bytes are not what its header says.
const REDOWNLOAD: &str = "the file is damaged or incomplete: download it again";

/// A checkpoint that cannot be loaded, naming the file, the tensor and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{dir}: no {SINGLE_FILE} or {INDEX_FILE}; this engine reads safetensors checkpoints (convert a pytorch_model.bin with transformers' `save_pretrained(dir, safe_serialization=True)`)")]
    NoCheckpoint { dir: String },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {message}")]
    Corrupt { path: String, message: String },
    #[error("{path}: {message}")]
    Index { path: String, message: String },
    #[error("{index} lists shard `{shard}`, which is not in {dir}: download every file the index names (or the whole model folder again)")]
    MissingShard {
        index: String,
        shard: String,
        dir: String,
    },
    #[error("tensor `{name}` is missing from {files}{others}; the weights do not match config.json ({summary}): use the config.json that came with these weights")]
    MissingTensor {
        name: String,
        files: String,
        others: String,
        summary: String,
    },
    #[error("tensor `{name}` in {path} has shape {found:?}, but config.json ({summary}) implies {expected:?}: the weights and config.json are from different models; use the config.json that came with these weights")]
    Shape {
        name: String,
        path: String,
        found: Vec<usize>,
        expected: Vec<usize>,
        summary: String,
    },
    #[error("tensor `{name}` in {path} has dtype {dtype}; this engine reads BF16 weights (F16 and F32 are converted at load): convert the checkpoint to bf16, e.g. transformers' `model.to(torch.bfloat16).save_pretrained(dir)`")]
    Dtype {
        name: String,
        path: String,
        dtype: String,
    },
    #[error("{path}: tensor{plural} {names} {verb} not part of the model this config.json describes ({summary}): the checkpoint is another architecture or variant, or config.json does not belong to it")]
    Unexpected {
        path: String,
        names: String,
        plural: &'static str,
        verb: &'static str,
        summary: String,
    },
    #[error("tensor `{name}` appears in both {first} and {second}; the shards overlap: download the model folder again")]
    Duplicate {
        name: String,
        first: String,
        second: String,
    },
}

/// One tensor of a checked header: where its bytes are in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    /// The dtype as the header spells it (`BF16`, `F32`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Byte offset of the data in the file (header included).
    pub start: usize,
    pub len_bytes: usize,
}

/// Bytes per element of the safetensors dtypes whose size is whole bytes.
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// The header's `{name: value}` pairs in file order, keeping duplicates (serde_json's map would
/// silently keep only the last of two entries with one name).
struct HeaderPairs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for HeaderPairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = HeaderPairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderPairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, Value>()? {
                    pairs.push(pair);
                }
                Ok(HeaderPairs(pairs))
            }
        }
        d.deserialize_map(PairsVisitor)
    }
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Parses and checks a safetensors header against the file's bytes. Pure: `bytes` is the whole
/// file; the message says what is wrong at which offset or tensor.
pub fn parse_header(bytes: &[u8]) -> Result<Vec<TensorEntry>, String> {
    let file_len = bytes.len();
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(format!(
            "the file is {file_len} bytes, shorter than the 8-byte header length every safetensors file starts with; {REDOWNLOAD}"
        ));
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    if header_len > MAX_HEADER_BYTES {
        return Err(format!(
            "the header length field says {header_len} bytes, more than the format's 100 MiB limit; {REDOWNLOAD}"
        ));
    }
    let data_start = 8 + header_len as usize;
    if data_start > file_len {
        return Err(format!(
            "the header length field says {header_len} bytes, but only {} bytes follow it: the header runs past the end of the file; {REDOWNLOAD}",
            file_len - 8
        ));
    }
    let header = std::str::from_utf8(&bytes[8..data_start])
        .map_err(|e| format!("the header is not UTF-8 text ({e}); {REDOWNLOAD}"))?;
    let pairs: HeaderPairs = serde_json::from_str(header)
        .map_err(|e| format!("the header is not a JSON object of tensors ({e}); {REDOWNLOAD}"))?;
    let data_len = (file_len - data_start) as u64;

    let mut entries: Vec<TensorEntry> = Vec::with_capacity(pairs.0.len());
    let mut seen: HashMap<&str, ()> = HashMap::with_capacity(pairs.0.len());
    for (name, value) in &pairs.0 {
        if name == "__metadata__" {
            continue;
        }
        if seen.insert(name, ()).is_some() {
            return Err(format!(
                "tensor `{name}` is listed twice in the header; {REDOWNLOAD}"
            ));
        }
        let raw: RawEntry = serde_json::from_value(value.clone()).map_err(|e| {
            format!("tensor `{name}`: expected {{dtype, shape, data_offsets}} ({e}); {REDOWNLOAD}")
        })?;
        let [begin, end] = raw.data_offsets;
        if begin > end {
            return Err(format!(
                "tensor `{name}`: data_offsets [{begin}, {end}] end before they begin; {REDOWNLOAD}"
            ));
        }
        if end > data_len {
            return Err(format!(
                "tensor `{name}`: data_offsets [{begin}, {end}] run past the end of the data ({data_len} bytes after the header): the file is truncated or its header is wrong; {REDOWNLOAD}"
            ));
        }
        let shape: Vec<usize> = raw
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| format!("tensor `{name}`: shape {:?} does not fit this machine's address space; {REDOWNLOAD}", raw.shape))?;
        if let Some(size) = dtype_size(&raw.dtype) {
            let expected = shape
                .iter()
                .try_fold(size as u64, |acc, &d| acc.checked_mul(d as u64));
            if expected != Some(end - begin) {
                return Err(format!(
                    "tensor `{name}`: shape {shape:?} of {} needs {} bytes, but data_offsets [{begin}, {end}] span {}; {REDOWNLOAD}",
                    raw.dtype,
                    expected.map_or("more than 2^64".to_string(), |b| b.to_string()),
                    end - begin
                ));
            }
        }
        entries.push(TensorEntry {
            name: name.clone(),
            dtype: raw.dtype,
            shape,
            start: data_start + begin as usize,
            len_bytes: (end - begin) as usize,
        });
    }

    let mut by_start: Vec<&TensorEntry> = entries.iter().filter(|e| e.len_bytes > 0).collect();
    by_start.sort_by_key(|e| e.start);
    for pair in by_start.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.start < a.start + a.len_bytes {
            return Err(format!(
                "tensors `{}` (bytes {}..{}) and `{}` (bytes {}..{}) overlap; {REDOWNLOAD}",
                a.name,
                a.start,
                a.start + a.len_bytes,
                b.name,
                b.start,
                b.start + b.len_bytes
            ));
        }
    }
    Ok(entries)
}

/// One memory-mapped safetensors file with its checked header.
#[derive(Debug)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub map: Arc<memmap2::Mmap>,
    pub entries: Vec<TensorEntry>,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        let io = |source| WeightsError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file truncated by another process while mapped would
        // fault, as with any mmap-based loader (safetensors, llama.cpp). The header is checked
        // against the length at open time.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let entries = parse_header(&map).map_err(|message| WeightsError::Corrupt {
            path: path.display().to_string(),
            message,
        })?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map: Arc::new(map),
            entries,
        })
    }
}

/// The checkpoint files of a folder: `model.safetensors`, or the shards its index lists.
pub fn open_checkpoint(dir: &Path) -> Result<Vec<SafetensorsFile>, WeightsError> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        return open_shards(dir, &index);
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![SafetensorsFile::open(&single)?]);
    }
    Err(WeightsError::NoCheckpoint {
        dir: dir.display().to_string(),
    })
}

fn open_shards(dir: &Path, index: &Path) -> Result<Vec<SafetensorsFile>, WeightsError> {
    let index_name = index.display().to_string();
    let bad = |message: String| WeightsError::Index {
        path: index_name.clone(),
        message,
    };
    let text = std::fs::read_to_string(index).map_err(|source| WeightsError::Io {
        path: index_name.clone(),
        source,
    })?;
    let root: Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not valid JSON ({e}); download it again")))?;
    let weight_map = root
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            bad("no `weight_map` object (tensor name -> shard file); download it again".into())
        })?;
    // Shard name -> the tensors the index places in it.
    let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, shard) in weight_map {
        let shard = shard.as_str().ok_or_else(|| {
            bad(format!(
                "`weight_map.{name}` is {shard}, expected a shard file name"
            ))
        })?;
        let plain = Path::new(shard)
            .file_name()
            .is_some_and(|f| f == std::ffi::OsStr::new(shard));
        if !plain {
            return Err(bad(format!(
                "`weight_map.{name}` names `{shard}`, which is not a file name in the model folder; download the index again"
            )));
        }
        shards.entry(shard).or_default().push(name);
    }
    if shards.is_empty() {
        return Err(bad("`weight_map` is empty; download it again".into()));
    }

    let mut files = Vec::with_capacity(shards.len());
    for (shard, names) in &shards {
        let path = dir.join(shard);
        if !path.is_file() {
            return Err(WeightsError::MissingShard {
                index: index_name.clone(),
                shard: shard.to_string(),
                dir: dir.display().to_string(),
            });
        }
        let file = SafetensorsFile::open(&path)?;
        for name in names {
            if !file.entries.iter().any(|e| e.name == *name) {
                return Err(bad(format!(
                    "places tensor `{name}` in {shard}, but {shard} has no such tensor: the index and the shard are from different downloads; download the model folder again"
                )));
            }
        }
        files.push(file);
    }
    Ok(files)
}

/// A one-line description of the config for error messages.
fn config_summary(config: &ModelConfig) -> String {
    match config {
        ModelConfig::Qwen3(c) => format!(
            "qwen3, {} layers, hidden {}, {} heads / {} KV heads of {}, intermediate {}, vocab {}, {} embeddings",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
            if c.tie_word_embeddings { "tied" } else { "untied" }
        ),
        ModelConfig::Qwen35Moe(c) => format!(
            "{}, {} layers ({} attention), hidden {}, {} experts of {} (top {}), vocab {}",
            config.model_type(),
            c.num_hidden_layers,
            c.attention_layers(),
            c.hidden_size,
            c.num_experts,
            c.moe_intermediate_size,
            c.num_experts_per_tok,
            c.vocab_size
        ),
    }
}

/// Loads and checks every tensor of the config's table from the checkpoint in `dir`, in table
/// order: bf16 tensors stay in the memory map, F16 and F32 ones are converted to bf16.
pub fn load_weights(dir: &Path, config: &ModelConfig) -> Result<LoadedWeights, WeightsError> {
    let files = open_checkpoint(dir)?;
    check_and_collect(&files, config)
}

/// Where a table entry's bytes are: one tensor, or its parts stacked.
enum Source<'a> {
    Whole((usize, usize)),
    Parts(Vec<((usize, usize), &'a str)>),
}

/// Where `spec`'s bytes are among the `found` tensors, if they are there whole or in parts.
fn source_of<'a>(
    found: &HashMap<&str, (usize, usize)>,
    spec: &'a TensorSpec,
) -> Option<Source<'a>> {
    if let Some(&at) = found.get(spec.name.as_str()) {
        return Some(Source::Whole(at));
    }
    if spec.parts.is_empty() {
        return None;
    }
    let parts: Option<Vec<_>> = spec
        .parts
        .iter()
        .map(|p| found.get(p.as_str()).map(|&at| (at, p.as_str())))
        .collect();
    parts.map(Source::Parts)
}

/// The table's tensors from already opened files (see [`load_weights`]).
pub fn check_and_collect(
    files: &[SafetensorsFile],
    config: &ModelConfig,
) -> Result<LoadedWeights, WeightsError> {
    let summary = config_summary(config);
    // Tensor name -> (file index, entry index), refusing a name held by two files.
    let mut found: HashMap<&str, (usize, usize)> = HashMap::new();
    for (fi, file) in files.iter().enumerate() {
        for (ei, entry) in file.entries.iter().enumerate() {
            if let Some((prev, _)) = found.insert(&entry.name, (fi, ei)) {
                return Err(WeightsError::Duplicate {
                    name: entry.name.clone(),
                    first: files[prev].path.display().to_string(),
                    second: file.path.display().to_string(),
                });
            }
        }
    }

    let table = config.tensor_table();
    let source = |spec| source_of(&found, spec);
    // (name, the first part missing when the tensor may also come in parts)
    let missing: Vec<(&str, Option<&str>)> = table
        .iter()
        .filter(|s| source(s).is_none())
        .map(|s| {
            let part = s.parts.iter().find(|p| !found.contains_key(p.as_str()));
            (s.name.as_str(), part.map(String::as_str))
        })
        .collect();
    if let Some(&(name, part)) = missing.first() {
        let files_list = files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let parts = part.map_or(String::new(), |p| {
            format!(" (nor stored per expert: `{p}` is missing too)")
        });
        return Err(WeightsError::MissingTensor {
            name: name.to_string(),
            files: files_list,
            others: match missing.len() {
                1 => parts,
                n => format!(
                    "{parts} (and {} more of the {} tensors the model needs)",
                    n - 1,
                    table.len()
                ),
            },
            summary,
        });
    }

    let known: HashMap<&str, ()> = table
        .iter()
        .flat_map(|s| std::iter::once(s.name.as_str()).chain(s.parts.iter().map(String::as_str)))
        .map(|n| (n, ()))
        .collect();
    for file in files {
        let mut extra: Vec<&str> = file
            .entries
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| !known.contains_key(n) && !config.ignorable_tensor(n))
            .collect();
        if !extra.is_empty() {
            extra.sort_unstable();
            let shown: Vec<String> = extra.iter().take(3).map(|n| format!("`{n}`")).collect();
            let more = if extra.len() > 3 {
                format!(" and {} more", extra.len() - 3)
            } else {
                String::new()
            };
            return Err(WeightsError::Unexpected {
                path: file.path.display().to_string(),
                names: format!("{}{more}", shown.join(", ")),
                plural: if extra.len() == 1 { "" } else { "s" },
                verb: if extra.len() == 1 { "is" } else { "are" },
                summary,
            });
        }
    }

    // Every stored shape against the table before anything is allocated: the table's sizes come
    // from config.json, which may not describe these files.
    for spec in &table {
        match source(spec).expect("checked above") {
            Source::Whole((fi, ei)) => {
                check_shape(&files[fi], ei, &spec.name, &spec.shape, &summary)?
            }
            Source::Parts(parts) => {
                for ((fi, ei), name) in parts {
                    check_shape(&files[fi], ei, name, &spec.part_shape, &summary)?;
                }
            }
        }
    }
    let total_bytes: usize = table.iter().map(|s| s.elements() * 2).sum();
    let bar = progress_bar(total_bytes);
    let mut tensors = Vec::with_capacity(table.len());
    for spec in &table {
        let data = match source(spec).expect("checked above") {
            Source::Whole((fi, ei)) => {
                read_tensor(&files[fi], ei, &spec.name, &spec.shape, &summary)?
            }
            Source::Parts(parts) => {
                // Stacked in table order into one owned buffer.
                let mut values: Vec<bf16> = Vec::with_capacity(spec.elements());
                for ((fi, ei), name) in parts {
                    let part = read_tensor(&files[fi], ei, name, &spec.part_shape, &summary)?;
                    let t = HostTensor {
                        spec: spec.clone(),
                        data: part,
                    };
                    values.extend_from_slice(&t.bf16());
                }
                TensorData::Owned(Arc::new(values))
            }
        };
        bar.inc((spec.elements() * 2) as u64);
        tensors.push(HostTensor {
            spec: spec.clone(),
            data,
        });
    }
    bar.finish_and_clear();
    Ok(LoadedWeights { tensors })
}

/// Entry `ei` of `file` has the shape the table expects (`name` and `shape`).
fn check_shape(
    file: &SafetensorsFile,
    ei: usize,
    name: &str,
    shape: &[usize],
    summary: &str,
) -> Result<(), WeightsError> {
    let entry = &file.entries[ei];
    if entry.shape != shape {
        return Err(WeightsError::Shape {
            name: name.to_string(),
            path: file.path.display().to_string(),
            found: entry.shape.clone(),
            expected: shape.to_vec(),
            summary: summary.to_string(),
        });
    }
    Ok(())
}

/// Entry `ei` of `file`, checked against the shape the table expects (`name` and `shape`), as
/// bf16: mapped when stored as BF16, converted from F16 or F32.
fn read_tensor(
    file: &SafetensorsFile,
    ei: usize,
    name: &str,
    shape: &[usize],
    summary: &str,
) -> Result<TensorData, WeightsError> {
    check_shape(file, ei, name, shape, summary)?;
    let entry = &file.entries[ei];
    let path = || file.path.display().to_string();
    let bytes = &file.map[entry.start..entry.start + entry.len_bytes];
    Ok(match entry.dtype.as_str() {
        "BF16" => TensorData::Mapped {
            map: Arc::clone(&file.map),
            start: entry.start,
            len_bytes: entry.len_bytes,
        },
        "F16" => TensorData::Owned(Arc::new(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()))
                .collect(),
        )),
        "F32" => TensorData::Owned(Arc::new(
            bytes
                .chunks_exact(4)
                .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        )),
        other => {
            return Err(WeightsError::Dtype {
                name: name.to_string(),
                path: path(),
                dtype: other.to_string(),
            })
        }
    })
}

/// A byte-counting bar on stderr for models large enough to take a while; indicatif draws nothing
/// when stderr is not a terminal (logs, tests).
fn progress_bar(total_bytes: usize) -> indicatif::ProgressBar {
    if total_bytes < PROGRESS_MIN_BYTES {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total_bytes as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "loading weights {bar:40} {bytes}/{total_bytes} ({eta})",
    ) {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with the given header JSON and `data_len` bytes of data.
    fn file_with(header: &str, data_len: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data_len, 0);
        out
    }

    #[test]
    fn parses_a_valid_header() {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#;
        let bytes = file_with(h, 16);
        let e = parse_header(&bytes).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "a");
        assert_eq!(e[0].start, 8 + h.len());
        assert_eq!((e[1].start, e[1].len_bytes), (8 + h.len() + 12, 4));
    }

    #[test]
    fn random_corruption_never_panics_and_accepted_entries_stay_in_bounds() {
        use rand::{Rng, SeedableRng};
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},"c":{"dtype":"I8","shape":[0],"data_offsets":[20,20]}}"#;
        let valid = file_with(h, 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut bytes = valid.clone();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..bytes.len());
                // Digits and brackets make offsets and shapes change while the JSON still parses.
                bytes[i] = match rng.gen_range(0..3) {
                    0 => rng.gen(),
                    1 => b"0123456789"[rng.gen_range(0..10)],
                    _ => b",[]{}\"\""[rng.gen_range(0..6)],
                };
            }
            bytes.truncate(rng.gen_range(0..=bytes.len() + 4).min(bytes.len()));
            if let Ok(entries) = parse_header(&bytes) {
                accepted += 1;
                for e in entries {
                    assert!(e.start + e.len_bytes <= bytes.len(), "{e:?}");
                }
            }
        }
        assert!(
            accepted > 0,
            "some corruptions still parse (inside data, or harmless)"
        );
    }

    #[test]
    fn hostile_headers_are_errors_not_panics() {
        let cases: &[(&[u8], &str)] = &[
            (b"\x05\x00", "shorter than the 8-byte header length"),
            (&u64::MAX.to_le_bytes(), "100 MiB"),
            (&file_with("{}", 0)[..9], "past the end of the file"),
        ];
        for (bytes, want) in cases {
            let err = parse_header(bytes).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let json_cases = [
            (
                r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}"#,
                4,
                "run past the end",
            ),
            (
                r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[8,0]}}"#,
                8,
                "end before they begin",
            ),
            (
                r#"{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "needs 6 bytes",
            ),
            (
                r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[4,12]}}"#,
                12,
                "overlap",
            ),
            (
                r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"a":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]}}"#,
                16,
                "listed twice",
            ),
            (
                r#"{"a":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
                8,
                "more than 2^64",
            ),
            (
                r#"{"a":{"dtype":"BF16"}}"#,
                0,
                "expected {dtype, shape, data_offsets}",
            ),
            (r#"[1,2]"#, 0, "not a JSON object"),
            ("{\"a\":", 0, "not a JSON object"),
        ];
        for (h, data, want) in json_cases {
            let err = parse_header(&file_with(h, data)).unwrap_err();
            assert!(err.contains(want), "{h}: {err}");
        }
        let mut not_utf8 = file_with("{\"\u{e9}\":1}", 0);
        not_utf8[10] = 0xff;
        assert!(parse_header(&not_utf8).unwrap_err().contains("UTF-8"));
    }
}

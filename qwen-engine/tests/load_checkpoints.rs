//! The Hugging Face folder loader on a fixture and on broken copies of it: what loads (bf16
//! mapped, F16/F32 converted, shards, tied extras) and what is refused, each error naming the
//! file, the tensor and the fix.

mod common;

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use qwen_engine::load::load_model_dir;
use qwen_engine::model::ModelConfig;
use qwen_engine::tokenizer::Tokenizer;
use qwen_engine::weights::safetensors::SafetensorsFile;
use qwen_engine::weights::{LoadedWeights, TensorData, Weights};
use safetensors::Dtype;
use serde_json::{json, Value};
use tempfile::TempDir;

const TIED: &str = "hd64-gqa4-tied";
const UNTIED: &str = "hd128-gqa2-untied";

/// One tensor as stored: name, dtype, shape, little-endian bytes.
#[derive(Clone)]
struct Stored {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn fixture_dir(name: &str) -> PathBuf {
    common::fixtures::fixtures_dir().join(name)
}

fn read_tensors(path: &Path) -> Vec<Stored> {
    let file = SafetensorsFile::open(path).unwrap();
    file.entries
        .iter()
        .map(|e| Stored {
            name: e.name.clone(),
            dtype: serde_json::from_value(json!(e.dtype)).unwrap(),
            shape: e.shape.clone(),
            data: file.map[e.start..e.start + e.len_bytes].to_vec(),
        })
        .collect()
}

fn write_tensors(path: &Path, tensors: &[Stored]) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|t| {
            let view =
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

/// A header and data written as given, lies included.
fn write_raw(path: &Path, header: &Value, data: &[u8]) {
    let h = header.to_string();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// A header for `tensors` laid out back to back, and their bytes.
fn header_for(tensors: &[Stored]) -> (Value, Vec<u8>) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for t in tensors {
        let dtype = serde_json::to_value(t.dtype).unwrap();
        header.insert(
            t.name.clone(),
            json!({"dtype": dtype, "shape": t.shape, "data_offsets": [data.len(), data.len() + t.data.len()]}),
        );
        data.extend_from_slice(&t.data);
    }
    (Value::Object(header), data)
}

/// A copy of a fixture's config.json and model.safetensors in a fresh folder.
fn copy_fixture(name: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir(name).join(f), dir.path().join(f)).unwrap();
    }
    dir
}

fn load_weights(dir: &Path) -> (ModelConfig, LoadedWeights) {
    match load_model_dir(dir).unwrap_or_else(|e| panic!("{e}")) {
        (c, Weights::Loaded(w), _) => (c, w),
        _ => unreachable!("a folder loads as Weights::Loaded"),
    }
}

fn load_error(dir: &Path) -> String {
    match load_model_dir(dir) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "expected `{p}` in: {err}");
    }
}

fn bf16_values(w: &LoadedWeights) -> Vec<Vec<bf16>> {
    w.tensors.iter().map(|t| t.bf16().into_owned()).collect()
}

#[test]
fn a_fixture_loads_in_table_order_memory_mapped() {
    let (config, w) = load_weights(&fixture_dir(UNTIED));
    let dense = config.as_qwen3().expect("a qwen3 fixture");
    assert_eq!(dense.num_key_value_heads, 2);
    assert!(!dense.tie_word_embeddings);
    let table = config.tensor_table();
    let names: Vec<&str> = w.tensors.iter().map(|t| t.spec.name.as_str()).collect();
    let want: Vec<&str> = table.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, want);
    assert!(w
        .tensors
        .iter()
        .all(|t| matches!(t.data, TensorData::Mapped { .. })));
    // The loaded values are the stored ones.
    let stored = read_tensors(&fixture_dir(UNTIED).join("model.safetensors"));
    let q = stored
        .iter()
        .find(|t| t.name == "model.layers.1.self_attn.q_proj.weight")
        .unwrap();
    let loaded = &w.tensors[names.iter().position(|n| *n == q.name).unwrap()];
    let first = bf16::from_le_bytes([q.data[0], q.data[1]]);
    assert_eq!(loaded.bf16()[0], first);
    assert_eq!(loaded.bf16().len() * 2, q.data.len());
    assert!(matches!(
        load_model_dir(&fixture_dir(UNTIED)).unwrap().2,
        Tokenizer::None { .. }
    ));
}

#[test]
fn f32_and_f16_checkpoints_are_converted_to_bf16() {
    let (_, original) = load_weights(&fixture_dir(TIED));
    let stored = read_tensors(&fixture_dir(TIED).join("model.safetensors"));
    let widen = |t: &Stored, dtype: Dtype, f: &dyn Fn(bf16) -> Vec<u8>| Stored {
        dtype,
        data: t
            .data
            .chunks_exact(2)
            .flat_map(|b| f(bf16::from_le_bytes([b[0], b[1]])))
            .collect(),
        ..t.clone()
    };

    let dir = copy_fixture(TIED);
    let f32s: Vec<Stored> = stored
        .iter()
        .map(|t| widen(t, Dtype::F32, &|v| v.to_f32().to_le_bytes().to_vec()))
        .collect();
    write_tensors(&dir.path().join("model.safetensors"), &f32s);
    let (_, w) = load_weights(dir.path());
    assert!(w
        .tensors
        .iter()
        .all(|t| matches!(t.data, TensorData::Owned(_))));
    assert_eq!(
        bf16_values(&w),
        bf16_values(&original),
        "bf16 -> f32 -> bf16 is exact"
    );

    let f16s: Vec<Stored> = stored
        .iter()
        .map(|t| {
            widen(t, Dtype::F16, &|v| {
                f16::from_f32(v.to_f32()).to_le_bytes().to_vec()
            })
        })
        .collect();
    write_tensors(&dir.path().join("model.safetensors"), &f16s);
    let (_, w) = load_weights(dir.path());
    let want: Vec<Vec<bf16>> = bf16_values(&original)
        .iter()
        .map(|t| {
            t.iter()
                .map(|v| bf16::from_f32(f16::from_f32(v.to_f32()).to_f32()))
                .collect()
        })
        .collect();
    assert_eq!(bf16_values(&w), want);
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() {
    let (_, single) = load_weights(&fixture_dir(UNTIED));
    let dir = copy_fixture(UNTIED);
    let stored = read_tensors(&dir.path().join("model.safetensors"));
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let (a, b) = stored.split_at(stored.len() / 2);
    let shards = [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ];
    let mut weight_map = serde_json::Map::new();
    for (file, tensors) in shards {
        write_tensors(&dir.path().join(file), tensors);
        for t in tensors {
            weight_map.insert(t.name.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    let index_path = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).unwrap();
    let (_, sharded) = load_weights(dir.path());
    assert_eq!(bf16_values(&sharded), bf16_values(&single));

    // An index naming a shard that is not there: both named.
    std::fs::remove_file(dir.path().join(shards[1].0)).unwrap();
    let err = load_error(dir.path());
    assert_mentions(
        &err,
        &["model.safetensors.index.json", shards[1].0, "download"],
    );

    // An index whose shard name leaves the folder.
    let mut evil = index.clone();
    evil["weight_map"][&a[0].name] = json!("../model-00001-of-00002.safetensors");
    std::fs::write(&index_path, evil.to_string()).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &["../model-00001-of-00002.safetensors", "not a file name"],
    );

    // An index that places a tensor in the wrong shard.
    write_tensors(&dir.path().join(shards[1].0), b);
    let mut wrong = index.clone();
    wrong["weight_map"][&b[0].name] = json!(shards[0].0);
    std::fs::write(&index_path, wrong.to_string()).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &[&b[0].name, shards[0].0, "no such tensor"],
    );

    // Two shards holding one tensor.
    let mut dup = b.to_vec();
    dup.push(a[0].clone());
    write_tensors(&dir.path().join(shards[1].0), &dup);
    std::fs::write(&index_path, index.to_string()).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &[&a[0].name, "both", shards[0].0, shards[1].0],
    );
}

#[test]
fn tied_lm_head_and_rotary_buffers_are_ignored_other_extras_refused() {
    let dir = copy_fixture(TIED);
    let path = dir.path().join("model.safetensors");
    let mut stored = read_tensors(&path);
    let embed = stored
        .iter()
        .find(|t| t.name == "model.embed_tokens.weight")
        .unwrap()
        .clone();
    stored.push(Stored {
        name: "lm_head.weight".into(),
        ..embed
    });
    stored.push(Stored {
        name: "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        dtype: Dtype::F32,
        shape: vec![32],
        data: vec![0; 128],
    });
    write_tensors(&path, &stored);
    let (_, w) = load_weights(dir.path());
    assert!(w.tensors.iter().all(|t| t.spec.name != "lm_head.weight"));

    stored.push(Stored {
        name: "model.layers.0.self_attn.q_proj.bias".into(),
        dtype: Dtype::BF16,
        shape: vec![512],
        data: vec![0; 1024],
    });
    write_tensors(&path, &stored);
    assert_mentions(
        &load_error(dir.path()),
        &[
            "model.safetensors",
            "`model.layers.0.self_attn.q_proj.bias`",
            "not part of the model this config.json describes",
            "config.json",
        ],
    );
}

#[test]
fn truncated_files_name_the_file_and_say_download_again() {
    let dir = copy_fixture(TIED);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for (keep, want) in [
        (bytes.len() * 3 / 5, "run past the end of the data"),
        (100, "past the end of the file"),
        (5, "shorter than the 8-byte header length"),
        (0, "shorter than the 8-byte header length"),
    ] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = load_error(dir.path());
        assert_mentions(&err, &["model.safetensors", want, "download it again"]);
    }
}

#[test]
fn headers_that_lie_about_offsets_are_refused() {
    let dir = copy_fixture(TIED);
    let path = dir.path().join("model.safetensors");
    let stored = read_tensors(&path);
    let (header, data) = header_for(&stored);
    let name = stored[1].name.clone();
    let o = &header[&name]["data_offsets"];
    let [begin, end] = [o[0].as_u64().unwrap(), o[1].as_u64().unwrap()];

    // Sanity: the rewritten file loads.
    write_raw(&path, &header, &data);
    load_weights(dir.path());

    let mut lie = header.clone();
    lie[&name]["data_offsets"] = json!([begin, data.len() + 16]);
    write_raw(&path, &lie, &data);
    assert_mentions(&load_error(dir.path()), &[&name, "run past the end"]);

    let mut overlap = header.clone();
    let other = &stored[0].name;
    let [ob, oe] = [
        overlap[other]["data_offsets"][0].as_u64().unwrap(),
        overlap[other]["data_offsets"][1].as_u64().unwrap(),
    ];
    // Move `name` onto `other`'s bytes, keeping its own length.
    let len = end - begin;
    overlap[&name]["data_offsets"] = json!([ob + 2, ob + 2 + len]);
    write_raw(&path, &overlap, &data);
    let err = load_error(dir.path());
    assert_mentions(&err, &["overlap", &name, other]);
    assert!(ob + 2 < oe);

    let mut short = header.clone();
    short[&name]["data_offsets"] = json!([begin, end - 2]);
    write_raw(&path, &short, &data);
    assert_mentions(
        &load_error(dir.path()),
        &[
            &name,
            &format!("needs {len} bytes"),
            &format!("span {}", len - 2),
        ],
    );

    // The 8-byte header length pointing past the end of the file.
    let mut bytes = std::fs::read(&path).unwrap();
    let total = bytes.len() as u64;
    bytes[..8].copy_from_slice(&total.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &["model.safetensors", "past the end of the file"],
    );
}

#[test]
fn wrong_model_type_and_missing_config_say_what_is_served() {
    let dir = copy_fixture(TIED);
    let config_path = dir.path().join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["model_type"] = json!("llama");
    std::fs::write(&config_path, config.to_string()).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &["config.json", "model_type", "`llama`", "Qwen3"],
    );
    std::fs::remove_file(&config_path).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &["has no config.json", "download the whole model folder"],
    );
    assert_mentions(
        &load_error(&dir.path().join("nowhere")),
        &["nowhere is not a folder", "tiny"],
    );
    std::fs::copy(fixture_dir(TIED).join("config.json"), &config_path).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &["no model.safetensors or model.safetensors.index.json"],
    );
}

#[test]
fn missing_misshaped_and_wrong_dtype_tensors_are_named() {
    let dir = copy_fixture(UNTIED);
    let path = dir.path().join("model.safetensors");
    let stored = read_tensors(&path);
    let victim = "model.layers.1.mlp.up_proj.weight";

    let without: Vec<Stored> = stored
        .iter()
        .filter(|t| t.name != victim)
        .cloned()
        .collect();
    write_tensors(&path, &without);
    assert_mentions(
        &load_error(dir.path()),
        &[
            &format!("`{victim}` is missing"),
            "model.safetensors",
            "config.json",
        ],
    );

    // `stored` with the victim replaced by `change(victim)`.
    let with_victim = |change: &dyn Fn(&Stored) -> Stored| -> Vec<Stored> {
        stored
            .iter()
            .map(|t| {
                if t.name == victim {
                    change(t)
                } else {
                    t.clone()
                }
            })
            .collect()
    };

    let reshaped = with_victim(&|t| Stored {
        shape: vec![t.shape[1], t.shape[0]],
        ..t.clone()
    });
    write_tensors(&path, &reshaped);
    assert_mentions(
        &load_error(dir.path()),
        &[
            victim,
            "shape [136, 200]",
            "implies [200, 136]",
            "config.json",
        ],
    );

    let f64s = with_victim(&|t| Stored {
        dtype: Dtype::F64,
        data: t
            .data
            .chunks_exact(2)
            .flat_map(|b| f64::from(bf16::from_le_bytes([b[0], b[1]])).to_le_bytes())
            .collect(),
        ..t.clone()
    });
    write_tensors(&path, &f64s);
    assert_mentions(
        &load_error(dir.path()),
        &[victim, "dtype F64", "BF16", "convert the checkpoint"],
    );

    // A config.json that asks for more layers than the weights have.
    std::fs::copy(fixture_dir(UNTIED).join("model.safetensors"), &path).unwrap();
    let config_path = dir.path().join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["num_hidden_layers"] = json!(3);
    std::fs::write(&config_path, config.to_string()).unwrap();
    assert_mentions(
        &load_error(dir.path()),
        &[
            "`model.layers.2.input_layernorm.weight` is missing",
            "and 10 more",
            "3 layers",
        ],
    );
}

/// A copy of a hybrid fixture folder's config.json and model.safetensors.
fn copy_hybrid(name: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = common::fixtures::hybrid_fixtures_dir().join(name);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

const HYBRID_PER_EXPERT: &str = "hybrid-l3f1-e8k2-cond-per-expert";
const HYBRID_FUSED: &str = "hybrid-l3f1-e8k2-text-fused";

#[test]
fn a_hybrid_checkpoint_skips_its_vision_tower_and_mtp_head_by_name_only() {
    let dir = copy_hybrid(HYBRID_PER_EXPERT);
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_tensors(&path);
    assert!(tensors.iter().any(|t| t.name.starts_with("model.visual.")));
    assert!(tensors.iter().any(|t| t.name.starts_with("mtp.")));
    let (config, w) = load_weights(dir.path());
    assert_eq!(config.model_type(), "qwen3_5_moe");
    assert_eq!(w.tensors.len(), config.tensor_table().len());
    // Any other extra tensor is refused by name.
    let mut extra = tensors[0].clone();
    extra.name = "model.language_model.layers.0.linear_attn.in_proj_qkv.bias".into();
    tensors.push(extra);
    write_tensors(&path, &tensors);
    assert_mentions(
        &load_error(dir.path()),
        &[
            "linear_attn.in_proj_qkv.bias",
            "not part of the model",
            "qwen3_5_moe",
        ],
    );
}

#[test]
fn a_missing_expert_names_the_fused_tensor_and_the_missing_part() {
    let dir = copy_hybrid(HYBRID_PER_EXPERT);
    let path = dir.path().join("model.safetensors");
    let gone = "model.language_model.layers.2.mlp.experts.5.up_proj.weight";
    let tensors: Vec<Stored> = read_tensors(&path)
        .into_iter()
        .filter(|t| t.name != gone)
        .collect();
    write_tensors(&path, &tensors);
    assert_mentions(
        &load_error(dir.path()),
        &[
            "`model.language_model.layers.2.mlp.experts.gate_up_proj` is missing",
            &format!("`{gone}` is missing too"),
            "use the config.json that came with these weights",
        ],
    );
}

#[test]
fn a_misshaped_fused_expert_tensor_is_named_with_both_shapes() {
    let dir = copy_hybrid(HYBRID_FUSED);
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_tensors(&path);
    let down = tensors
        .iter_mut()
        .find(|t| t.name == "model.layers.1.mlp.experts.down_proj")
        .expect("a fused fixture");
    // [E, H, I] stored as [E, I, H]: the same bytes, the wrong shape.
    down.shape.swap(1, 2);
    write_tensors(&path, &tensors);
    assert_mentions(
        &load_error(dir.path()),
        &[
            "model.layers.1.mlp.experts.down_proj",
            "[8, 32, 64]",
            "[8, 64, 32]",
        ],
    );
}

#[test]
fn per_expert_and_fused_checkpoints_give_the_same_stacked_experts() {
    let (_, fused) = load_weights(&common::fixtures::hybrid_fixtures_dir().join(HYBRID_FUSED));
    let per = copy_hybrid("hybrid-l3f1-e8k2-text-per-expert");
    let (_, stacked) = load_weights(per.path());
    assert_eq!(bf16_values(&fused), bf16_values(&stacked));
    // The stacked form is owned (copied at load); the fused one stays in the memory map.
    let gate_up = |w: &LoadedWeights| {
        w.tensors
            .iter()
            .find(|t| t.spec.name == "model.layers.0.mlp.experts.gate_up_proj")
            .unwrap()
            .data
            .clone()
    };
    assert!(matches!(gate_up(&fused), TensorData::Mapped { .. }));
    assert!(matches!(gate_up(&stacked), TensorData::Owned(_)));
}

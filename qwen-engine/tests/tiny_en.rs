//! The committed `tiny-en` model (models/tiny-en, trained by scripts/train-tiny.py): its files load
//! through the Hugging Face loader, its tokenizer.json gives the byte ids, and greedy decode on the
//! CPU reference runner writes printable text, the same twice. No GPU needed.

use aot_kernels::ops::sampling::SamplingParams;
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::scheduler::{Event, RequestSpec};
use qwen_engine::source::{open_model, tiny_en_dir, ModelSource};
use qwen_engine::tokenizer::Tokenizer;

const PROMPT: &str = "HAMLET:\nTo be, or not to be";
const NEW_TOKENS: usize = 96;

fn greedy(src: &ModelSource, prompt: &[u32], new_tokens: usize) -> Vec<u32> {
    let runner = CpuRunner::new(
        &src.config,
        &src.weights,
        CpuRunnerOptions {
            max_slots: 1,
            kv_blocks: 32,
        },
    )
    .unwrap();
    let model = src.config.describe();
    let mut engine = Engine::new(Box::new(runner), &model, EngineOptions::for_model(&model));
    engine
        .submit(RequestSpec {
            prompt: prompt.to_vec(),
            max_new_tokens: new_tokens,
            sampling: SamplingParams::GREEDY,
            seed: 0,
            stop_at_eos: true,
        })
        .unwrap();
    let mut out = Vec::new();
    engine
        .run(|ev| {
            if let Event::Token { token, .. } = ev {
                out.push(*token);
            }
        })
        .unwrap();
    out
}

#[test]
fn the_weights_file_stays_small_and_the_record_is_beside_it() {
    let dir = tiny_en_dir();
    let bytes = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(
        bytes <= 8_000_000,
        "model.safetensors is {bytes} bytes, over 8 MB"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("train-record.json")).unwrap()).unwrap();
    assert_eq!(record["weights_bytes"].as_u64(), Some(bytes));
}

#[test]
fn its_tokenizer_json_gives_the_byte_ids() {
    let src = open_model("tiny-en", 0).unwrap();
    assert!(matches!(src.tokenizer, Tokenizer::Hf(_)));
    let text = "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow!\n\t~{}";
    let ids = src.tokenizer.encode(text).unwrap();
    assert_eq!(ids, Tokenizer::Bytes.encode(text).unwrap());
    assert_eq!(src.tokenizer.decode(&ids), text);
}

#[test]
fn greedy_decode_on_the_cpu_writes_printable_text() {
    let src = open_model("tiny-en", 0).unwrap();
    assert_eq!(src.name, "tiny-en");
    assert_eq!(src.config.model_type(), "qwen3");
    let vocab = src.config.describe().vocab_size;
    let prompt = src.tokenizer.encode(PROMPT).unwrap();
    let first = greedy(&src, &prompt, NEW_TOKENS);
    assert_eq!(
        first.len(),
        NEW_TOKENS,
        "no end-of-sequence token: it runs to the limit"
    );
    assert!(
        first.iter().all(|&t| (t as usize) < vocab && t < 256),
        "every token is a byte: {first:?}"
    );
    let text = src.tokenizer.decode(&first);
    assert!(
        text.bytes()
            .all(|b| b == b'\n' || (b' '..=b'~').contains(&b)),
        "printable ASCII: {text:?}"
    );
    let letters = text.bytes().filter(u8::is_ascii_alphabetic).count();
    assert!(
        letters * 2 > text.len(),
        "mostly letters, as English is: {text:?}"
    );
    assert!(text.contains(' '), "words, not one long run: {text:?}");
    assert_eq!(
        greedy(&src, &prompt, NEW_TOKENS),
        first,
        "greedy decode is the same twice"
    );
}

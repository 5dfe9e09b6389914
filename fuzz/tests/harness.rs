//! The harness itself: the seed choices describe models that load and run, so the model target
//! reaches the executor rather than stopping at validation.

use rill::exec::{Logits, Model};
use rill::gguf::GgufFile;
use rill_fuzz::{tiny_model, Choices};

fn load(choices: &[u8]) -> Model {
    let bytes = tiny_model(&mut Choices::new(choices));
    let file = GgufFile::from_bytes(bytes).expect("parses");
    let be = rill::backend::create("cpu").expect("cpu");
    Model::load(&file, be, &mut |_| {}).expect("the seed model loads")
}

#[test]
fn seed_models_load_and_run() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/model");
    for name in ["dense", "moe"] {
        let choices = std::fs::read(seeds.join(name)).expect("seed");
        let model = load(&choices);
        assert_eq!(model.config.moe.is_some(), name == "moe", "{name}");
        let mut s = model.new_session(4).expect("session");
        let logits = model
            .prefill(&mut s, &[1, 2, 3], Logits::Last, &mut |_, _| {})
            .expect("prefill");
        assert_eq!(logits.len(), model.config.n_vocab);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "{name}: finite weights give finite logits"
        );
    }
}

//! The embedded model's speed on this CPU: prefill (prompt tokens/s) at a
//! few prompt lengths, and decode (generated tokens/s) at short and long
//! context, plus the KV-cache reuse an agent's next turn gets.
//!
//! Needs the model: `rollcall model fetch` (or ROLLCALL_MODEL_FILE).
//! Run with `cargo bench --bench model` (`make bench` does).

use rollcall::config::EmbeddedConfig;
use rollcall::model::sample::Sampling;
use rollcall::model::{Model, Step};
use std::time::{Duration, Instant};

/// Tokens of a prompt and how long the phases took.
struct Run {
    cached: usize,
    prefill: Duration,
    decode: Duration,
    generated: usize,
}

fn run(model: &Model, prompt: Vec<u32>, max_tokens: usize) -> Run {
    let started = Instant::now();
    let mut rx = model
        .generate(
            prompt,
            None,
            max_tokens,
            Sampling {
                temperature: 0.8,
                seed: Some(1),
                ..Sampling::default()
            },
            0,
            None,
        )
        .expect("the model takes a generation");
    let (mut cached, mut first, mut generated) = (0, None, 0);
    while let Some(step) = rx.blocking_recv() {
        match step {
            Step::Started { cached: c } => cached = c,
            Step::Token { .. } => {
                generated += 1;
                first.get_or_insert_with(Instant::now);
            }
            Step::Done(_) => break,
            Step::Failed(e) => panic!("generation failed: {e}"),
            Step::Prompt(_) => {}
        }
    }
    let first = first.expect("at least one token");
    Run {
        cached,
        prefill: first - started,
        decode: first.elapsed(),
        generated,
    }
}

/// A prompt of exactly `n` tokens: the chat template around a long user
/// text, cut to length (varied by `salt` so no KV cache matches it).
fn prompt(model: &Model, n: usize, salt: usize) -> Vec<u32> {
    let text: String = (0..n)
        .map(|i| format!("item {} of list {salt}; ", i * 7 % 1000))
        .collect();
    let msgs =
        [serde_json::json!({"role": "user", "content": format!("{salt}: summarize this: {text}")})];
    let text = model.text();
    let rendered = text.template.render(&msgs, &[]).expect("template");
    let mut ids = text.vocab.encode(&rendered, false).expect("tokenize");
    ids.truncate(n);
    ids
}

fn main() {
    let path = std::env::var_os("ROLLCALL_MODEL_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(rollcall::model::fetch::default_model_path);
    if !path.exists() {
        eprintln!(
            "model bench: {} is missing; run `rollcall model fetch` (make bench does)",
            path.display()
        );
        std::process::exit(1);
    }
    let t = Instant::now();
    let options = EmbeddedConfig {
        kv_slots: 8,
        ..EmbeddedConfig::default()
    };
    let model = Model::load(&path, options).expect("load the model");
    println!(
        "embedded model {} ({}), {} cores, {} threads: loaded in {:.2} s",
        model.name,
        path.display(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        model.threads(),
        t.elapsed().as_secs_f64()
    );
    run(&model, prompt(&model, 64, 0), 4); // warm up

    println!("\n{:<34} {:>10} {:>12}", "phase", "tokens", "tokens/s");
    for (i, n) in [128usize, 512, 1024, 2048].into_iter().enumerate() {
        let r = run(&model, prompt(&model, n, i + 1), 1);
        println!(
            "{:<34} {:>10} {:>12.1}",
            format!("prefill, {n}-token prompt"),
            n,
            n as f64 / r.prefill.as_secs_f64()
        );
    }
    for (i, n) in [32usize, 1024].into_iter().enumerate() {
        let r = run(&model, prompt(&model, n, 10 + i), 128);
        println!(
            "{:<34} {:>10} {:>12.1}",
            format!("decode, after a {n}-token prompt"),
            r.generated - 1,
            (r.generated - 1) as f64 / r.decode.as_secs_f64()
        );
    }
    // Concurrent generations decode in one batch: aggregate tokens/s.
    for streams in [1usize, 4, 8] {
        let started = Instant::now();
        let rxs: Vec<_> = (0..streams)
            .map(|i| {
                model
                    .generate(
                        prompt(&model, 32, 30 + i),
                        None,
                        64,
                        Sampling {
                            temperature: 0.8,
                            seed: Some(i as u64),
                            ..Sampling::default()
                        },
                        0,
                        None,
                    )
                    .expect("the model takes a generation")
            })
            .collect();
        let tokens: usize = std::thread::scope(|s| {
            let handles: Vec<_> = rxs
                .into_iter()
                .map(|mut rx| {
                    s.spawn(move || {
                        let mut n = 0;
                        while let Some(step) = rx.blocking_recv() {
                            match step {
                                Step::Token { .. } => n += 1,
                                Step::Done(_) => break,
                                Step::Failed(e) => panic!("generation failed: {e}"),
                                Step::Started { .. } | Step::Prompt(_) => {}
                            }
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        println!(
            "{:<34} {:>10} {:>12.1}",
            format!("{streams} concurrent streams (aggregate)"),
            tokens,
            tokens as f64 / started.elapsed().as_secs_f64()
        );
    }
    // An agent's next turn: the last prompt plus 64 new tokens.
    let first = prompt(&model, 1024, 20);
    let r1 = run(&model, first.clone(), 1);
    let mut next = first;
    next.extend(prompt(&model, 64, 21));
    let r2 = run(&model, next, 1);
    println!(
        "{:<34} {:>10} {:>12}",
        "next turn (KV cache reused)",
        format!("{}+{}", r2.cached, 64),
        format!(
            "{:.0} ms vs {:.0} ms",
            r2.prefill.as_secs_f64() * 1e3,
            r1.prefill.as_secs_f64() * 1e3
        )
    );
}

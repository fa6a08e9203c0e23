//! Generation on the tiny-ling fixture engine, natively (lavapipe): greedy equals the engine's argmax steps,
//! seeded sampling is reproducible, abort, multi-turn continuation from the engine's states, context limits.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use lingtab::engine::EngineOptions;
use lingtab::generate::{Event, FinishReason, GenerateOptions, Generation, SamplingOptions, Session};
use lingtab::model::chat::Message;
use lingtab::model::tokenizer::Tokenizer;

const PROMPT: [u32; 6] = [2949, 3536, 786, 0, 571, 2730];
const N_CTX: usize = 64;

fn session() -> Session {
    let model = common::fixture::model();
    let tokenizer = Tokenizer::from_header(model.header()).unwrap();
    let engine = common::fixture::engine(&model, &EngineOptions { n_ctx: Some(N_CTX), ..Default::default() });
    Session::new(engine, tokenizer)
}

fn options(max_tokens: usize, sampling: SamplingOptions) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling, stop: Vec::new(), thinking: false }
}

fn run(mut generation: Generation<'_>) -> (Vec<Event>, Vec<u32>) {
    let mut events = Vec::new();
    while let Some(e) = pollster::block_on(generation.next()).unwrap() {
        events.push(e);
    }
    assert_eq!(events.iter().filter(|e| e.finish.is_some()).count(), 1);
    assert!(events.last().unwrap().finish.is_some());
    assert!(pollster::block_on(generation.next()).unwrap().is_none());
    let tokens = events.iter().filter_map(|e| e.token).collect();
    assert_eq!(tokens, generation.tokens());
    (events, tokens)
}

/// `n` greedy tokens after `prompt` with the engine's GPU argmax, cut before the first end-of-generation token.
fn reference_greedy(session: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    session.reset();
    let engine = &mut session.engine;
    let mut next = 0;
    for &t in prompt {
        next = pollster::block_on(engine.step_argmax(t)).unwrap();
    }
    let mut out = Vec::new();
    while out.len() < n && !session.tokenizer.is_eog(next) {
        out.push(next);
        if out.len() < n {
            next = pollster::block_on(session.engine.step_argmax(next)).unwrap();
        }
    }
    out
}

#[test]
fn greedy_generation_equals_engine_argmax_steps() {
    let mut s = session();
    let n = 24;
    let expected = reference_greedy(&mut s, &PROMPT, n);
    let (events, tokens) = run(s.generate_tokens(&PROMPT, options(n, SamplingOptions::greedy())).unwrap());
    assert_eq!(tokens, expected);
    let finish = events.last().unwrap().finish.unwrap();
    assert_eq!(finish, if expected.len() == n { FinishReason::Length } else { FinishReason::Stop });
    // the full-logits path (top-k 1 at temperature 1) picks the same tokens as the GPU argmax
    let top1 = SamplingOptions { temperature: 1.0, top_k: 1, top_p: 1.0, min_p: 0.0, ..SamplingOptions::default() };
    let (_, tokens) = run(s.generate_tokens(&PROMPT, options(n, top1)).unwrap());
    assert_eq!(tokens, expected);
    eprintln!("greedy: {expected:?}");
}

#[test]
fn seeded_sampling_is_reproducible_and_depends_on_the_seed() {
    let mut s = session();
    let sampling = |seed| SamplingOptions { temperature: 0.8, top_p: 0.9, top_k: 0, min_p: 0.0, seed, ..SamplingOptions::default() };
    let (_, a) = run(s.generate_tokens(&PROMPT, options(24, sampling(1))).unwrap());
    let (_, b) = run(s.generate_tokens(&PROMPT, options(24, sampling(1))).unwrap());
    let (_, c) = run(s.generate_tokens(&PROMPT, options(24, sampling(2))).unwrap());
    eprintln!("seed 1: {a:?}\nseed 2: {c:?}");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn abort_stops_within_one_token_and_the_engine_goes_on() {
    let mut s = session();
    let expected = reference_greedy(&mut s, &PROMPT, 12);
    assert_eq!(expected.len(), 12, "the fixture's greedy run ends early");
    {
        let mut g = s.generate_tokens(&PROMPT, options(100, SamplingOptions::greedy())).unwrap();
        for _ in 0..3 {
            let e = pollster::block_on(g.next()).unwrap().unwrap();
            assert!(e.finish.is_none());
        }
        g.abort();
        let last = pollster::block_on(g.next()).unwrap().unwrap();
        assert_eq!(last.finish, Some(FinishReason::Aborted));
        assert_eq!(last.token, None);
        assert!(pollster::block_on(g.next()).unwrap().is_none());
        assert_eq!(g.tokens(), &expected[..3]);
    }
    // the third token was generated but not run: the engine holds the prompt and two tokens
    assert_eq!(s.engine.position(), PROMPT.len() + 2);
    let (_, tokens) = run(s.generate_tokens(&PROMPT, options(12, SamplingOptions::greedy())).unwrap());
    assert_eq!(tokens, expected);
    // abort before the first event: nothing runs
    let before = s.engine.tokens().to_vec();
    let mut g = s.generate_tokens(&PROMPT, options(12, SamplingOptions::greedy())).unwrap();
    g.abort();
    let (events, tokens) = run(g);
    assert_eq!(events.len(), 1);
    assert!(tokens.is_empty());
    assert_eq!(s.engine.tokens(), before);
}

#[test]
fn a_second_chat_turn_continues_from_the_engine_states() {
    let mut s = session();
    for thinking in [false, true] {
        s.reset();
        let mut messages = vec![Message::system("Be brief."), Message::user("Hello there")];
        let opts = GenerateOptions { thinking, ..options(5, SamplingOptions::greedy()) };
        let (reply_text, reply_reasoning, first_prompt) = {
            let mut g = s.generate(&messages, opts.clone()).unwrap();
            while pollster::block_on(g.next()).unwrap().is_some() {}
            assert_eq!(g.reused_tokens(), 0);
            (g.text().to_string(), g.reasoning().to_string(), g.prompt_tokens().to_vec())
        };
        let held = s.engine.tokens().to_vec();
        assert!(held.starts_with(&first_prompt));
        messages.push(Message::assistant(reply_text).with_reasoning(reply_reasoning));
        messages.push(Message::user("And then?"));
        let mut g = s.generate(&messages, opts.clone()).unwrap();
        let prompt = g.prompt_tokens().to_vec();
        assert!(prompt.starts_with(&held), "thinking {thinking}: the second prompt extends the held tokens");
        pollster::block_on(g.next()).unwrap().unwrap();
        assert_eq!(g.reused_tokens(), held.len(), "thinking {thinking}: only the new suffix ran");
        drop(g);
        assert_eq!(s.engine.position(), prompt.len());
        eprintln!("thinking {thinking}: turn 2 reused {} of {} prompt tokens", held.len(), prompt.len());

        // a different history cannot continue: it starts over
        let other = [Message::system("Be brief."), Message::user("Hello here")];
        let mut g = s.generate(&other, opts.clone()).unwrap();
        pollster::block_on(g.next()).unwrap().unwrap();
        assert_eq!(g.reused_tokens(), 0);
    }
}

#[test]
fn prompts_beyond_the_context_are_refused_and_a_full_context_ends_generation() {
    let mut s = session();
    let long: Vec<u32> = PROMPT.iter().copied().cycle().take(N_CTX).collect();
    let e = s.generate_tokens(&long, options(4, SamplingOptions::greedy())).err().unwrap();
    assert!(e.contains("64 tokens") && e.contains("context"), "{e}");
    let e = s.generate(&[Message::user("word ".repeat(200))], options(4, SamplingOptions::greedy())).err().unwrap();
    assert!(e.contains("context"), "{e}");
    assert!(s.generate_tokens(&[], options(4, SamplingOptions::greedy())).is_err());
    assert!(s.generate_tokens(&PROMPT, options(0, SamplingOptions::greedy())).is_err());
    let bad = SamplingOptions { top_p: 0.0, ..SamplingOptions::default() };
    assert!(s.generate_tokens(&PROMPT, options(4, bad)).err().unwrap().contains("top_p"));

    // 60 prompt tokens in a context of 64: five tokens (the last is not run), then context_full
    let prompt = &long[..N_CTX - 4];
    let (events, tokens) = run(s.generate_tokens(prompt, options(100, SamplingOptions::greedy())).unwrap());
    if !events.iter().any(|e| e.finish == Some(FinishReason::Stop)) {
        assert_eq!(tokens.len(), 5);
        assert_eq!(events.last().unwrap().finish, Some(FinishReason::ContextFull));
        assert_eq!(s.engine.position(), N_CTX);
    }
}

#[test]
fn stop_strings_end_the_answer() {
    let mut s = session();
    let (events, _) = run(s.generate_tokens(&PROMPT, options(24, SamplingOptions::greedy())).unwrap());
    let text: String = events.iter().map(|e| e.text.as_str()).collect();
    // a stop string from the middle of the greedy answer cuts it exactly there
    let chars: Vec<char> = text.chars().collect();
    if chars.len() >= 8 {
        let from = chars.len() / 2;
        let stop: String = chars[from..from + 3].iter().collect();
        let expected: String = text[..text.find(&stop).unwrap()].to_string();
        let opts = GenerateOptions { stop: vec![stop.clone()], ..options(24, SamplingOptions::greedy()) };
        let (events, _) = run(s.generate_tokens(&PROMPT, opts).unwrap());
        let cut: String = events.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(cut, expected, "stop {stop:?}");
        assert_eq!(events.last().unwrap().finish, Some(FinishReason::StopString));
    }
}

/// Absurd option values, a prompt or message longer than the context, a reply that fills the context, and no
/// bound on the reply's length: each is a clear error naming what is wrong (before any step) or a clean end
/// (`context_full`), and the same engine then gives the reference reply.
#[test]
fn limits_and_absurd_options_are_clear_errors_and_the_engine_goes_on() {
    let mut s = session();
    let expected = reference_greedy(&mut s, &PROMPT, 6);
    let greedy = SamplingOptions::greedy;
    let bad: Vec<(GenerateOptions, &str)> = vec![
        (options(4, SamplingOptions { temperature: f32::NAN, ..greedy() }), "temperature"),
        (options(4, SamplingOptions { temperature: -1.0, ..greedy() }), "temperature"),
        (options(4, SamplingOptions { temperature: f32::INFINITY, ..greedy() }), "temperature"),
        (options(4, SamplingOptions { top_p: 0.0, ..greedy() }), "top_p"),
        (options(4, SamplingOptions { top_p: 1.5, ..greedy() }), "top_p"),
        (options(4, SamplingOptions { top_p: f32::NAN, ..greedy() }), "top_p"),
        (options(4, SamplingOptions { min_p: -0.1, ..greedy() }), "min_p"),
        (options(4, SamplingOptions { min_p: 2.0, ..greedy() }), "min_p"),
        (options(4, SamplingOptions { repetition_penalty: 0.0, ..greedy() }), "repetition_penalty"),
        (options(4, SamplingOptions { repetition_penalty: f32::NAN, ..greedy() }), "repetition_penalty"),
        (options(4, SamplingOptions { presence_penalty: f32::INFINITY, ..greedy() }), "presence_penalty"),
        (options(0, greedy()), "max_tokens"),
        (GenerateOptions { stop: vec![String::new()], ..options(4, greedy()) }, "stop strings"),
    ];
    let n_bad = bad.len();
    for (o, name) in bad {
        let before = s.engine.tokens().to_vec();
        let e = s.generate_tokens(&PROMPT, o.clone()).err().unwrap_or_else(|| panic!("{o:?} was accepted"));
        assert!(e.contains(name), "{o:?}: {e}");
        assert_eq!(s.engine.tokens(), before, "{name}: a refused generation ran a step");
    }
    // prompts and messages longer than the context: refused before any step
    let long: Vec<u32> = PROMPT.iter().copied().cycle().take(N_CTX + 10).collect();
    let e = s.generate_tokens(&long, options(4, greedy())).err().unwrap();
    assert!(e.contains(&format!("the prompt is {} tokens but the context holds {N_CTX}", N_CTX + 10)), "{e}");
    let e = s.generate(&[Message::user("word ".repeat(500))], options(4, greedy())).err().unwrap();
    assert!(e.contains(&format!("the context holds {N_CTX}")), "{e}");
    assert!(s.generate_tokens(&[], options(4, greedy())).err().unwrap().contains("empty"));
    let e = s.generate_tokens(&[u32::MAX], options(4, greedy())).err().unwrap();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let (_, tokens) = run(s.generate_tokens(&PROMPT, options(6, greedy())).unwrap());
    assert_eq!(tokens, expected, "after {n_bad} refused option sets and 4 refused prompts");

    // no bound on the reply: it ends when the context is full (or at an end-of-generation token)
    let prompt: Vec<u32> = PROMPT.iter().copied().cycle().take(N_CTX - 3).collect();
    let (events, tokens) = run(s.generate_tokens(&prompt, options(usize::MAX, SamplingOptions { temperature: 0.7, seed: 3, ..SamplingOptions::default() })).unwrap());
    let finish = events.last().unwrap().finish.unwrap();
    eprintln!("{} prompt tokens in a context of {N_CTX}: {} tokens, then {}", prompt.len(), tokens.len(), finish.as_str());
    assert!(finish == FinishReason::ContextFull || finish == FinishReason::Stop, "{finish:?}");
    if finish == FinishReason::ContextFull {
        assert_eq!(s.engine.position(), N_CTX);
        assert_eq!(tokens.len(), 4, "three positions left: three tokens run, the fourth generated but not run");
    }
    // a step at a full context is refused by the engine itself, and the session goes on
    if s.engine.position() == N_CTX {
        let e = pollster::block_on(s.engine.step(PROMPT[0])).unwrap_err();
        assert!(e.contains("the context is full"), "{e}");
    }
    let (_, tokens) = run(s.generate_tokens(&PROMPT, options(6, greedy())).unwrap());
    assert_eq!(tokens, expected, "after a full context");
}

/// The same limits on the command line: absurd values are refused (naming the option) before the model is
/// loaded, a prompt longer than the context before any step.
#[test]
fn the_cli_refuses_absurd_options_and_prompts_beyond_the_context() {
    let gguf = common::fixture::path("tiny-ling-00001-of-00002.gguf");
    let generate = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lingtab"))
            .args(["generate", "--gguf", gguf.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let long = "word ".repeat(500);
    let cases: [(&[&str], &str); 7] = [
        (&["--prompt", "Hi", "--temperature", "NaN"], "temperature must be a finite number"),
        (&["--prompt", "Hi", "--temperature=-2"], "temperature must be a finite number"),
        (&["--prompt", "Hi", "--temperature", "0", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (&["--prompt", "Hi", "--max-tokens", "0"], "max_tokens must be at least 1"),
        (&["--prompt", "Hi", "--temperature", "0", "--ctx", "0"], "context length must be at least 1"),
        (&["--prompt", "Hi", "--temperature", "0", "--pool-bytes", "0"], "an expert pool of 0 bytes holds 0 expert records"),
        (&["--prompt", &long, "--temperature", "0", "--ctx", "64"], "but the context holds 64"),
    ];
    for (args, want) in cases {
        let (ok, stdout, stderr) = generate(args);
        assert!(!ok && stdout.is_empty(), "{args:?}: {stdout}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    let (ok, _, stderr) = generate(&["--prompt", "Hi", "--temperature", "0", "--max-tokens", "2"]);
    assert!(ok, "{stderr}");
}

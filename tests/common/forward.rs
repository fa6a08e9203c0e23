//! The whole step against llama.cpp's f32 twin of the tiny-ling fixture (golden/forward_cases.json): logits at
//! every position, and the 32-token greedy continuation. Runs natively and in the browser.

use lingtab::engine::Engine;
use serde_json::Value;

/// The tolerances of the forward-pass issue: per position before the first routing near-tie.
pub const MAX_ABS: f32 = 2e-3;
pub const MAX_RMS: f32 = 2e-4;
/// A routing decision closer than this may legitimately go the other way in f32.
const ROUTING_NEAR_TIE: f64 = 1e-4;
/// Top-1/top-2 logit margins below this may legitimately swap.
const ARGMAX_NEAR_TIE: f32 = 1e-3;

pub struct Case {
    pub id: String,
    pub tokens: Vec<u32>,
    /// llama.cpp's f32-twin logits, one row per position
    pub logits: Vec<Vec<f32>>,
    pub greedy: Vec<u32>,
    pub greedy_margins: Vec<f32>,
    /// first position whose routing has a near-tie in some layer (positions from here on are not compared)
    pub first_near_tie: usize,
}

/// Parses the cases; `read(file)` returns the bytes of a golden file.
pub fn cases(json: &str, mut read: impl FnMut(&str) -> Vec<u8>) -> Vec<Case> {
    let doc: Value = serde_json::from_str(json).unwrap();
    let vocab = doc["n_vocab"].as_u64().unwrap() as usize;
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let f = &c["f32"];
            let bytes = read(f["prefill_logits"]["file"].as_str().unwrap());
            let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            let tokens: Vec<u32> = c["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
            let mut first_near_tie = tokens.len();
            for layer in f["routing_margins"]["per_layer"].as_object().unwrap().values() {
                for key in ["group_margin", "expert_margin"] {
                    if let Some(pos) = layer[key].as_array().unwrap().iter().position(|m| m.as_f64().unwrap() < ROUTING_NEAR_TIE) {
                        first_near_tie = first_near_tie.min(pos);
                    }
                }
            }
            Case {
                id: c["id"].as_str().unwrap().to_string(),
                logits: values.chunks(vocab).map(|r| r.to_vec()).collect(),
                greedy: f["greedy"]["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect(),
                greedy_margins: f["greedy"]["top1_top2_margin"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap() as f32).collect(),
                tokens,
                first_near_tie,
            }
        })
        .collect()
}

fn top2_margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::MIN, f32::MIN);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}

/// Feeds the case token by token and checks every comparable position; returns (max |Δ|, max rms) seen and
/// the engine's logits.
pub async fn check_logits(engine: &mut Engine, case: &Case) -> (f32, f32, Vec<Vec<f32>>) {
    engine.reset();
    let (mut worst_abs, mut worst_rms) = (0f32, 0f32);
    let mut rows = Vec::with_capacity(case.tokens.len());
    for (pos, &token) in case.tokens.iter().enumerate() {
        let got = engine.step(token).await.unwrap();
        rows.push(got.clone());
        if pos >= case.first_near_tie {
            continue;
        }
        let want = &case.logits[pos];
        let max_abs = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let rms = (got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / want.len() as f64).sqrt() as f32;
        assert!(max_abs <= MAX_ABS && rms <= MAX_RMS, "case {} position {pos}: max |Δlogit| {max_abs:.2e}, rms {rms:.2e}", case.id);
        if top2_margin(want) > ARGMAX_NEAR_TIE {
            assert_eq!(argmax(&got), argmax(want), "case {} position {pos}: argmax differs", case.id);
        }
        worst_abs = worst_abs.max(max_abs);
        worst_rms = worst_rms.max(rms);
    }
    (worst_abs, worst_rms, rows)
}

/// The greedy continuation after the prompt, compared up to the first step llama.cpp itself calls a near-tie,
/// and at most `steps` steps.
pub async fn check_greedy(engine: &mut Engine, case: &Case, steps: usize) -> usize {
    if case.first_near_tie < case.tokens.len() {
        return 0; // the prompt's own routing may go either way; its continuation is not comparable
    }
    engine.reset();
    // the prompt through the chunked prefill (check_logits feeds it token by token), so the continuation also
    // checks the prefill's states against llama.cpp
    let mut next = argmax(&engine.feed(&case.tokens).await.unwrap()) as u32;
    let mut compared = 0;
    let greedy = &case.greedy[..case.greedy.len().min(steps)];
    for (step, &want) in greedy.iter().enumerate() {
        if case.greedy_margins[step] < ARGMAX_NEAR_TIE {
            break;
        }
        assert_eq!(next, want, "case {} greedy step {step}", case.id);
        compared += 1;
        if step + 1 < greedy.len() {
            next = engine.next_greedy(next).await.unwrap();
        }
    }
    compared
}

/// The prompt [`run_ahead_is_taken_or_undone`] feeds first (the third engine's context holds it and 2 more).
pub const RUN_AHEAD_PROMPT: [u32; 5] = [2949, 3536, 786, 0, 571];

/// `next_greedy` submits the step for its pick before reading the pick back. Its picks are `step_argmax`'s, and
/// whatever the caller does next (a feed that ends with the step run ahead or goes on past it, a step of another
/// token, a feed of other tokens) gives exactly the logits of a second engine fed the same tokens one by one.
/// `plain` and `ahead` are engines of the same model and options (token by token, so they agree to the bit),
/// `short` one whose context holds [`RUN_AHEAD_PROMPT`] and 2 more tokens.
pub async fn run_ahead_is_taken_or_undone(mut plain: Engine, mut ahead: Engine, mut short: Engine) {
    use lingtab::generate::sampler::argmax;
    let prompt = RUN_AHEAD_PROMPT;
    ahead.set_run_ahead(true);
    short.set_run_ahead(true);
    let mut picks = vec![argmax(&plain.feed(&prompt).await.unwrap())];
    for _ in 0..6 {
        picks.push(plain.step_argmax(*picks.last().unwrap()).await.unwrap());
    }
    let mut picked = vec![argmax(&ahead.feed(&prompt).await.unwrap())];
    for _ in 0..6 {
        picked.push(ahead.next_greedy(*picked.last().unwrap()).await.unwrap());
    }
    assert_eq!(picked, picks, "the same picks as step_argmax");
    // the states hold picks[..6] after the prompt, and picks[6] run ahead, not counted yet
    let mut held: Vec<u32> = prompt.iter().chain(&picks[..6]).copied().collect();
    assert_eq!(ahead.tokens(), &held[..]);

    // a feed that ends with the step run ahead returns its logits
    held.push(picks[6]);
    same(&ahead.feed(&held).await.unwrap(), &fresh(&mut plain, &held).await, "a feed ending with the step run ahead");
    assert_eq!(ahead.tokens(), &held[..]);

    // a step of another token than the one run ahead undoes it
    let want_pick = argmax(&fresh(&mut plain, &held).await);
    let pick = ahead.next_greedy(want_pick).await.unwrap();
    held.push(want_pick);
    let other = (pick + 1) % ahead.vocab_size() as u32;
    held.push(other);
    same(&ahead.step(other).await.unwrap(), &fresh(&mut plain, &held).await, "a step of another token");

    // a feed that goes on past the step run ahead keeps it
    let pick = ahead.next_greedy(7).await.unwrap();
    held.extend([7, pick, 11, 12]);
    same(&ahead.feed(&held).await.unwrap(), &fresh(&mut plain, &held).await, "a feed past the step run ahead");

    // a feed of other tokens starts over
    ahead.next_greedy(3).await.unwrap();
    let elsewhere = [5u32, 6, 7];
    same(&ahead.feed(&elsewhere).await.unwrap(), &fresh(&mut plain, &elsewhere).await, "a feed of other tokens");

    // nothing runs ahead past the context: its last position is stepped, the next is refused
    let next = argmax(&short.feed(&prompt).await.unwrap());
    let next = short.next_greedy(next).await.unwrap();
    let last = short.next_greedy(next).await.unwrap();
    assert_eq!(short.position(), prompt.len() + 2);
    assert!(short.next_greedy(last).await.unwrap_err().contains("context is full"));
}

/// The logits of `engine` fed `tokens` from an empty sequence.
async fn fresh(engine: &mut Engine, tokens: &[u32]) -> Vec<f32> {
    engine.reset();
    engine.feed(tokens).await.unwrap()
}

/// Logits equal to the bit (the largest difference in the message, not the vectors).
fn same(got: &[f32], want: &[f32], what: &str) {
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(got.len() == want.len() && got == want, "{what}: logits differ (max |Δ| {worst:.3e})");
}

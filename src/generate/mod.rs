//! Generation: a chat (or a raw prompt) in, a stream of text events out, on top of the engine's single
//! step. [`sampler`] picks tokens, [`text`] turns token bytes into answer and reasoning text.
//!
//! Multi-turn chats continue from the engine's states: when a reply ends, the session remembers the tokens
//! the engine holds (the prompt, the reply's own tokens, then what closes the turn) together with the
//! template's rendering of the conversation so far. A next prompt whose rendering starts with that text is
//! fed as those tokens plus the new suffix, so only the suffix runs (the KDA states cannot step back, so a
//! prompt that does not extend them starts over).

pub mod sampler;
pub mod text;

use crate::engine::Engine;
use crate::model::chat::{self, Message, ROLE_END};
use crate::model::tokenizer::Tokenizer;
pub use sampler::{Sampler, SamplingOptions};
use text::{ReasoningSplitter, StopMatcher, Utf8Decoder, THINK_CLOSE};

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens to generate (≥ 1); the end-of-generation token is not counted.
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    /// Strings that end the answer (matched in the answer text, not in the reasoning); the answer stops
    /// exactly before the first one.
    pub stop: Vec<String>,
    /// The chat template's `detailed thinking on` (generation starts inside `<think>`) or `off`.
    pub thinking: bool,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions { max_tokens: 512, sampling: SamplingOptions::default(), stop: Vec::new(), thinking: true }
    }
}

impl GenerateOptions {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_tokens == 0 {
            return Err("max_tokens must be at least 1".into());
        }
        if self.stop.iter().any(String::is_empty) {
            return Err("stop strings must not be empty".into());
        }
        self.sampling.validate()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Stop,
    /// A stop string appeared in the answer.
    StopString,
    /// `max_tokens` were generated.
    Length,
    /// [`Generation::abort`] was called.
    Aborted,
    /// The context is full.
    ContextFull,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::StopString => "stop_string",
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
            FinishReason::ContextFull => "context_full",
        }
    }
}

/// One step of a generation: the text it adds (either may be empty while text is held back, e.g. half a
/// character or what could start a stop string), the token it generated, and, on the last event, why it ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event {
    /// Answer text added.
    pub text: String,
    /// Reasoning text added.
    pub reasoning: String,
    /// The token generated (None on a final event without a new token, and for an end-of-generation token).
    pub token: Option<u32>,
    pub finish: Option<FinishReason>,
}

/// What the engine's states hold after a finished chat reply, and the rendering of the conversation that
/// corresponds to it.
struct Continuation {
    tokens: Vec<u32>,
    text: String,
}

pub struct Session {
    pub engine: Engine,
    pub tokenizer: Tokenizer,
    continuation: Option<Continuation>,
}

impl Session {
    pub fn new(engine: Engine, tokenizer: Tokenizer) -> Session {
        Session { engine, tokenizer, continuation: None }
    }

    /// Forgets the conversation: the engine starts over.
    pub fn reset(&mut self) {
        self.engine.reset();
        self.continuation = None;
    }

    /// A reply to `messages` (rendered with the Bailing V3 template, special tokens parsed). Continues from
    /// the engine's states when the conversation extends the one they hold.
    pub fn generate(&mut self, messages: &[Message], options: GenerateOptions) -> Result<Generation<'_>, String> {
        let state = self.begin(messages, options)?;
        Ok(Generation { session: self, state })
    }

    /// A continuation of raw prompt tokens (no template). Generation starts inside the reasoning when the
    /// prompt's text has an unclosed `<think>`.
    pub fn generate_tokens(&mut self, prompt: &[u32], options: GenerateOptions) -> Result<Generation<'_>, String> {
        let state = self.begin_tokens(prompt, options)?;
        Ok(Generation { session: self, state })
    }

    /// [`generate`](Session::generate) as a state that does not borrow the session (for callers that hold
    /// the session elsewhere between steps, like the JavaScript iterator): step it with
    /// [`GenerationState::next`].
    pub fn begin(&mut self, messages: &[Message], options: GenerateOptions) -> Result<GenerationState, String> {
        options.validate()?;
        let text = chat::render(messages, options.thinking);
        let mut prompt = None;
        if let Some(c) = &self.continuation {
            if text.len() > c.text.len() && text.starts_with(&c.text) && c.tokens.starts_with(self.engine.tokens()) {
                let mut ids = c.tokens.clone();
                ids.extend(self.tokenizer.encode(&text[c.text.len()..], true));
                prompt = Some(ids);
            }
        }
        let prompt = prompt.unwrap_or_else(|| self.tokenizer.encode(&text, true));
        let in_reasoning = ReasoningSplitter::starts_in_reasoning(&text);
        let chat = ChatTurn { messages: messages.to_vec(), thinking: options.thinking };
        self.start(prompt, options, in_reasoning, Some(chat))
    }

    /// [`generate_tokens`](Session::generate_tokens) as a state that does not borrow the session.
    pub fn begin_tokens(&mut self, prompt: &[u32], options: GenerateOptions) -> Result<GenerationState, String> {
        options.validate()?;
        // the prompt's last few hundred tokens are enough to see whether it left `<think>` open
        let tail = &prompt[prompt.len().saturating_sub(256)..];
        let in_reasoning = ReasoningSplitter::starts_in_reasoning(&String::from_utf8_lossy(&self.tokenizer.decode(tail)));
        self.start(prompt.to_vec(), options, in_reasoning, None)
    }

    fn start(&mut self, prompt: Vec<u32>, options: GenerateOptions, in_reasoning: bool, chat: Option<ChatTurn>) -> Result<GenerationState, String> {
        if prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        let n_ctx = self.engine.n_ctx;
        if prompt.len() >= n_ctx {
            return Err(format!(
                "the prompt is {} tokens but the context holds {n_ctx}: no room to generate (shorten the prompt or raise the context length)",
                prompt.len()
            ));
        }
        let vocab = self.engine.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!("prompt token id {bad} is outside the vocabulary (size {vocab})"));
        }
        self.continuation = None;
        let sampler = Sampler::new(options.sampling.clone())?;
        let fast_greedy = options.sampling.is_plain_greedy();
        let stop = StopMatcher::new(&options.stop);
        Ok(GenerationState {
            prompt,
            max_tokens: options.max_tokens,
            sampler,
            fast_greedy,
            decoder: Utf8Decoder::new(),
            splitter: ReasoningSplitter::new(in_reasoning),
            stop,
            chat,
            pending: None,
            generated: Vec::new(),
            reused: 0,
            started: false,
            aborted: false,
            finished: None,
            done: false,
            reasoning: String::new(),
            content: String::new(),
        })
    }
}

struct ChatTurn {
    messages: Vec<Message>,
    thinking: bool,
}

/// A generation in progress: call [`next`](Generation::next) until it returns `None`.
pub struct Generation<'a> {
    session: &'a mut Session,
    state: GenerationState,
}

impl Generation<'_> {
    /// See [`GenerationState::next`].
    pub async fn next(&mut self) -> Result<Option<Event>, String> {
        self.state.next(self.session).await
    }
}

impl std::ops::Deref for Generation<'_> {
    type Target = GenerationState;
    fn deref(&self) -> &GenerationState {
        &self.state
    }
}

impl std::ops::DerefMut for Generation<'_> {
    fn deref_mut(&mut self) -> &mut GenerationState {
        &mut self.state
    }
}

/// The state of a generation, stepped with the session it was begun on.
pub struct GenerationState {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampler: Sampler,
    fast_greedy: bool,
    decoder: Utf8Decoder,
    splitter: ReasoningSplitter,
    stop: StopMatcher,
    chat: Option<ChatTurn>,
    /// The last token generated, not yet run through the engine.
    pending: Option<u32>,
    generated: Vec<u32>,
    reused: usize,
    started: bool,
    aborted: bool,
    finished: Option<FinishReason>,
    /// The final event was returned.
    done: bool,
    reasoning: String,
    content: String,
}

impl GenerationState {
    /// The next event: the first call runs the prompt (only the part the engine does not hold already), each
    /// later one generates one token. The last event carries `finish`; after it, `None`. `session` must be
    /// the one the generation was begun on.
    pub async fn next(&mut self, session: &mut Session) -> Result<Option<Event>, String> {
        if self.done {
            return Ok(None);
        }
        let result = self.advance(session).await;
        if result.is_err() {
            self.done = true;
        }
        result.map(Some)
    }

    /// Ends the generation: the next [`next`](GenerationState::next) returns the final event, `Aborted`. The engine
    /// stays usable (the states hold the prompt and the tokens generated so far).
    pub fn abort(&mut self) {
        self.aborted = true;
    }

    /// The prompt's tokens (for a chat turn that continues, the held tokens followed by the new suffix).
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.prompt
    }
    /// How many prompt tokens the engine already held and did not run again (known after the first event).
    pub fn reused_tokens(&self) -> usize {
        self.reused
    }
    /// The tokens generated so far (without the end-of-generation token).
    pub fn tokens(&self) -> &[u32] {
        &self.generated
    }
    /// The whole answer so far.
    pub fn text(&self) -> &str {
        &self.content
    }
    /// The whole reasoning so far.
    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finished
    }

    async fn advance(&mut self, session: &mut Session) -> Result<Event, String> {
        if self.aborted {
            return Ok(self.finish(session, Event::default(), FinishReason::Aborted));
        }
        let engine = &mut session.engine;
        let token = match self.pending {
            None => {
                let held = engine.tokens();
                self.reused = if self.prompt.len() > held.len() && self.prompt.starts_with(held) { held.len() } else { 0 };
                let mut logits = engine.feed(&self.prompt).await?;
                self.started = true;
                self.sampler.sample(&mut logits, engine.tokens())
            }
            Some(t) if self.fast_greedy => engine.next_greedy(t).await?,
            Some(t) => {
                let mut logits = engine.step(t).await?;
                self.sampler.sample(&mut logits, engine.tokens())
            }
        };
        if session.tokenizer.is_eog(token) {
            self.pending = None;
            return Ok(self.finish(session, Event::default(), FinishReason::Stop));
        }
        self.pending = Some(token);
        self.generated.push(token);

        let mut event = Event { token: Some(token), ..Event::default() };
        let mut decoded = String::new();
        self.decoder.push(session.tokenizer.decode_piece(token), &mut decoded);
        let mut answer = String::new();
        self.splitter.push(&decoded, &mut event.reasoning, &mut answer);
        let stopped = self.stop.push(&answer, &mut event.text);
        self.reasoning.push_str(&event.reasoning);
        self.content.push_str(&event.text);
        if stopped {
            return Ok(self.finish(session, event, FinishReason::StopString));
        }
        if self.generated.len() >= self.max_tokens {
            return Ok(self.finish(session, event, FinishReason::Length));
        }
        if session.engine.position() >= session.engine.n_ctx {
            return Ok(self.finish(session, event, FinishReason::ContextFull));
        }
        Ok(event)
    }

    /// Flushes held text into `event`, marks it final and records what the engine holds for the next turn.
    fn finish(&mut self, session: &mut Session, mut event: Event, reason: FinishReason) -> Event {
        if reason != FinishReason::StopString {
            let mut decoded = String::new();
            self.decoder.finish(&mut decoded);
            let mut answer = String::new();
            self.splitter.push(&decoded, &mut event.reasoning, &mut answer);
            self.splitter.finish(&mut event.reasoning);
            self.stop.push(&answer, &mut event.text);
            self.stop.finish(&mut event.text);
            self.reasoning.push_str(&event.reasoning);
            self.content.push_str(&event.text);
        }
        event.finish = Some(reason);
        self.finished = Some(reason);
        self.done = true;
        session.continuation = self.continuation(session, reason);
        event
    }

    /// For a chat turn that ended without cutting its text (not at a stop string, and after the prompt ran):
    /// the engine's tokens, the reply's last token, the tokens that close the turn (`</think>` when it ended
    /// inside the reasoning, then `<|role_end|>`), and the template's rendering of the conversation with
    /// this reply, which a next prompt starts with.
    fn continuation(&self, session: &Session, reason: FinishReason) -> Option<Continuation> {
        let chat = self.chat.as_ref()?;
        if reason == FinishReason::StopString || !self.started {
            return None;
        }
        let tokenizer = &session.tokenizer;
        let role_end = tokenizer.token_id(ROLE_END)?;
        let mut tokens = session.engine.tokens().to_vec();
        tokens.extend(self.pending);
        if self.splitter.in_reasoning() {
            tokens.extend(tokenizer.encode(THINK_CLOSE, true));
        }
        tokens.push(role_end);
        let mut messages = chat.messages.clone();
        messages.push(Message::assistant(self.content.clone()).with_reasoning(self.reasoning.clone()));
        let mut text = chat::render(&messages, chat.thinking);
        let generation_prompt = chat::render(&[], chat.thinking);
        let suffix = &generation_prompt[generation_prompt.rfind("<role>ASSISTANT</role>")?..];
        text.truncate(text.len().checked_sub(suffix.len())?);
        Some(Continuation { tokens, text })
    }
}

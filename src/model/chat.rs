//! The Bailing V3 chat template of Ling 3.0 (ling-architecture.md §11), as the seed's `lingChatPrompt`
//! renders it, plus assistant tool calls.
//!
//! ```text
//! <role>SYSTEM</role>[system text + "\n"]detailed thinking on|off<|role_end|>
//! <role>HUMAN</role>{user}<|role_end|>
//! <role>ASSISTANT</role>\n<think>{reasoning}</think>{content}[\n<tool_call>…</tool_call>]*<|role_end|>
//! <role>OBSERVATION</role>[\n<tool_response>\n{tool}\n</tool_response>]+<|role_end|>
//! <role>ASSISTANT</role>\n<think>            (generation prompt; `\n<think></think>` with thinking off)
//! ```
//! (No line breaks between the parts.) Unverified against the model's jinja text (spec D11): the newline
//! trimming around reasoning and the placement of tool calls (here GLM-style: each call after the content,
//! preceded by `\n`, arguments as `<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n`).

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(format!("unknown chat role '{other}' (expected system, user, assistant or tool)")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        })
    }
}

/// A call an assistant turn makes. Argument values are rendered as they are: the caller turns
/// non-string JSON values into their JSON text first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The assistant's reasoning (`reasoning_content`); kept in the prompt for earlier turns.
    pub reasoning: Option<String>,
    /// Assistant turns only; ignored for other roles.
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into(), reasoning: None, tool_calls: Vec::new() }
    }
    pub fn system(content: impl Into<String>) -> Message {
        Message::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new(Role::Assistant, content)
    }
    pub fn tool(content: impl Into<String>) -> Message {
        Message::new(Role::Tool, content)
    }
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Message {
        self.reasoning = Some(reasoning.into());
        self
    }
    pub fn with_tool_call(mut self, call: ToolCall) -> Message {
        self.tool_calls.push(call);
        self
    }
}

pub const ROLE_END: &str = "<|role_end|>";

/// The prompt for `messages` followed by the generation prompt of an assistant turn; `thinking` picks
/// `detailed thinking on` (generation opens `<think>`) or `off` (generation starts after `<think></think>`).
pub fn render(messages: &[Message], thinking: bool) -> String {
    let mode = if thinking { "detailed thinking on" } else { "detailed thinking off" };
    let first_system = messages.first().filter(|m| m.role == Role::System);
    let mut s = String::from("<role>SYSTEM</role>");
    match first_system {
        Some(m) if has_thinking_switch(&m.content) => s.push_str(&m.content),
        Some(m) => {
            s.push_str(&m.content);
            s.push('\n');
            s.push_str(mode);
        }
        None => s.push_str(mode),
    }
    s.push_str(ROLE_END);

    let start = usize::from(first_system.is_some());
    for i in start..messages.len() {
        let m = &messages[i];
        match m.role {
            Role::User => push_turn(&mut s, "HUMAN", &m.content),
            Role::System => push_turn(&mut s, "SYSTEM", &m.content),
            Role::Assistant => render_assistant(&mut s, m),
            Role::Tool => {
                if i == 0 || messages[i - 1].role != Role::Tool {
                    s.push_str("<role>OBSERVATION</role>");
                }
                s.push_str("\n<tool_response>\n");
                s.push_str(&m.content);
                s.push_str("\n</tool_response>");
                if i + 1 == messages.len() || messages[i + 1].role != Role::Tool {
                    s.push_str(ROLE_END);
                }
            }
        }
    }
    s.push_str(if thinking { "<role>ASSISTANT</role>\n<think>" } else { "<role>ASSISTANT</role>\n<think></think>" });
    s
}

/// Whether a system text sets the mode itself (`/detailed thinking (on|off)/` anywhere in it).
fn has_thinking_switch(text: &str) -> bool {
    text.contains("detailed thinking on") || text.contains("detailed thinking off")
}

fn push_turn(s: &mut String, role: &str, content: &str) {
    s.push_str("<role>");
    s.push_str(role);
    s.push_str("</role>");
    s.push_str(content);
    s.push_str(ROLE_END);
}

fn render_assistant(s: &mut String, m: &Message) {
    let mut reasoning: &str = m.reasoning.as_deref().unwrap_or("");
    let mut content: &str = &m.content;
    // Reasoning left inside the content (`<think>…</think>answer`) is moved out of it.
    if reasoning.is_empty() && content.contains("</think>") {
        let before_close = content.split("</think>").next().unwrap_or("").trim_end_matches('\n');
        reasoning = before_close.rsplit("<think>").next().unwrap_or("").trim_start_matches('\n');
        content = content.rsplit("</think>").next().unwrap_or("").trim_start_matches('\n');
    }
    s.push_str("<role>ASSISTANT</role>\n<think>");
    if reasoning.is_empty() {
        s.push_str("</think>");
        s.push_str(content);
    } else {
        s.push_str(reasoning.trim_matches('\n'));
        s.push_str("</think>");
        s.push_str(content.trim_start_matches('\n'));
    }
    for call in &m.tool_calls {
        s.push_str("\n<tool_call>");
        s.push_str(&call.name);
        s.push('\n');
        for (key, value) in &call.arguments {
            s.push_str("<arg_key>");
            s.push_str(key);
            s.push_str("</arg_key>\n<arg_value>");
            s.push_str(value);
            s.push_str("</arg_value>\n");
        }
        s.push_str("</tool_call>");
    }
    s.push_str(ROLE_END);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_user_turn_thinking_on_and_off() {
        let msgs = [Message::user("Hi")];
        assert_eq!(
            render(&msgs, true),
            "<role>SYSTEM</role>detailed thinking on<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>\n<think>"
        );
        assert_eq!(
            render(&msgs, false),
            "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>\n<think></think>"
        );
        assert_eq!(render(&[], false), "<role>SYSTEM</role>detailed thinking off<|role_end|><role>ASSISTANT</role>\n<think></think>");
    }

    #[test]
    fn system_message_with_and_without_its_own_switch() {
        let plain = [Message::system("You are Ling."), Message::user("Hi")];
        assert_eq!(
            render(&plain, true),
            "<role>SYSTEM</role>You are Ling.\ndetailed thinking on<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>\n<think>"
        );
        // The system text's own switch wins and is kept as written; the generation prompt follows `thinking`.
        let own = [Message::system("Be brief. detailed thinking off"), Message::user("Hi")];
        assert_eq!(
            render(&own, true),
            "<role>SYSTEM</role>Be brief. detailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>\n<think>"
        );
        // A later system message is a turn of its own.
        let later = [Message::user("a"), Message::system("b")];
        assert_eq!(
            render(&later, false),
            "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>a<|role_end|><role>SYSTEM</role>b<|role_end|><role>ASSISTANT</role>\n<think></think>"
        );
    }

    #[test]
    fn multi_turn_keeps_earlier_reasoning() {
        let msgs = [
            Message::user("2+2?"),
            Message::assistant("\n4").with_reasoning("\nadd them\n\n"),
            Message::user("and 3+3?"),
            Message::assistant("<think>\nsix\n</think>\n\n6"),
            Message::user("thanks"),
            Message::assistant("bye"),
            Message::user("!"),
        ];
        assert_eq!(
            render(&msgs, true),
            concat!(
                "<role>SYSTEM</role>detailed thinking on<|role_end|>",
                "<role>HUMAN</role>2+2?<|role_end|>",
                "<role>ASSISTANT</role>\n<think>add them</think>4<|role_end|>",
                "<role>HUMAN</role>and 3+3?<|role_end|>",
                "<role>ASSISTANT</role>\n<think>six</think>6<|role_end|>",
                "<role>HUMAN</role>thanks<|role_end|>",
                "<role>ASSISTANT</role>\n<think></think>bye<|role_end|>",
                "<role>HUMAN</role>!<|role_end|>",
                "<role>ASSISTANT</role>\n<think>",
            )
        );
        // Empty reasoning inside the content: the answer after `</think>` only, leading newlines dropped.
        let empty = [Message::assistant("<think></think>\nok")];
        assert!(render(&empty, false).contains("<role>ASSISTANT</role>\n<think></think>ok<|role_end|>"));
    }

    #[test]
    fn consecutive_tool_messages_share_one_observation() {
        let msgs = [
            Message::user("weather?"),
            Message::assistant(""),
            Message::tool("sunny"),
            Message::tool("22C"),
            Message::user("and now?"),
            Message::tool("rain"),
        ];
        assert_eq!(
            render(&msgs, false),
            concat!(
                "<role>SYSTEM</role>detailed thinking off<|role_end|>",
                "<role>HUMAN</role>weather?<|role_end|>",
                "<role>ASSISTANT</role>\n<think></think><|role_end|>",
                "<role>OBSERVATION</role>\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response><|role_end|>",
                "<role>HUMAN</role>and now?<|role_end|>",
                "<role>OBSERVATION</role>\n<tool_response>\nrain\n</tool_response><|role_end|>",
                "<role>ASSISTANT</role>\n<think></think>",
            )
        );
    }

    #[test]
    fn tool_calls() {
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: vec![("city".into(), "Paris".into()), ("days".into(), "3".into())],
        };
        let msgs = [
            Message::system("Use tools."),
            Message::user("Paris?"),
            Message::assistant("Checking.")
                .with_reasoning("need weather")
                .with_tool_call(call)
                .with_tool_call(ToolCall { name: "now".into(), arguments: vec![] }),
            Message::tool("{\"temp\": 20}"),
        ];
        assert_eq!(
            render(&msgs, true),
            concat!(
                "<role>SYSTEM</role>Use tools.\ndetailed thinking on<|role_end|>",
                "<role>HUMAN</role>Paris?<|role_end|>",
                "<role>ASSISTANT</role>\n<think>need weather</think>Checking.",
                "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
                "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
                "\n<tool_call>now\n</tool_call><|role_end|>",
                "<role>OBSERVATION</role>\n<tool_response>\n{\"temp\": 20}\n</tool_response><|role_end|>",
                "<role>ASSISTANT</role>\n<think>",
            )
        );
    }

    #[test]
    fn roles_parse() {
        assert_eq!("tool".parse::<Role>(), Ok(Role::Tool));
        assert!("robot".parse::<Role>().is_err());
        assert_eq!(Role::Assistant.to_string(), "assistant");
    }
}

//! The three workloads of the speculative-decoding benchmark, each request made
//! deterministically from (client, round): (a) an agent loop that resends its transcript
//! and asks for a small edit of code or JSON it has seen, (b) summaries that quote the
//! prompt, (c) open chat, where little repeats.

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Agent,
    Summary,
    Chat,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Agent => "agent",
            Workload::Summary => "summary",
            Workload::Chat => "chat",
        }
    }

    /// The chat messages of request `round` of client `client`.
    pub fn messages(self, client: usize, round: usize) -> Value {
        let k = client * 7919 + round * 104_729;
        match self {
            Workload::Agent => agent(k),
            Workload::Summary => summary(k),
            Workload::Chat => chat(k),
        }
    }
}

const NAMES: [&str; 8] = ["price", "count", "total", "weight", "score", "limit", "offset", "rate"];
const NEW_NAMES: [&str; 8] = ["amount", "tally", "sum", "mass", "points", "cap", "shift", "speed"];

fn code(k: usize) -> String {
    let (a, b) = (NAMES[k % 8], NAMES[(k / 8 + 3) % 8]);
    format!(
        "class Ledger:\n    def __init__(self, {a}, {b}):\n        self.{a} = {a}\n        self.{b} = {b}\n        self.entries = []\n\n    def add(self, name, value):\n        self.entries.append((name, value * self.{a}))\n        return len(self.entries)\n\n    def report(self):\n        lines = []\n        for name, value in self.entries:\n            lines.append(f\"{{name}}: {{value}} ({{self.{b}}})\")\n        return \"\\n\".join(lines)\n"
    )
}

fn config_json(k: usize) -> String {
    format!(
        "{{\n  \"service\": \"ledger-{k}\",\n  \"timeout\": {},\n  \"retries\": {},\n  \"endpoints\": [\"/add\", \"/report\", \"/health\"],\n  \"log_level\": \"info\",\n  \"cache\": {{\"enabled\": true, \"size_mb\": {}}}\n}}",
        10 + k % 50,
        k % 5,
        64 << (k % 3)
    )
}

/// A transcript that already holds the file and one edit of it, then asks for another.
fn agent(k: usize) -> Value {
    let (file, kind) = if k % 2 == 0 { (code(k), "python") } else { (config_json(k), "json") };
    let first = if kind == "python" {
        format!("Rename `{}` to `{}` everywhere.", NAMES[k % 8], NEW_NAMES[k % 8])
    } else {
        "Set \"retries\" to 3.".to_string()
    };
    let edited = if kind == "python" {
        file.replace(NAMES[k % 8], NEW_NAMES[k % 8])
    } else {
        file.replacen(&format!("\"retries\": {}", k % 5), "\"retries\": 3", 1)
    };
    let second = if kind == "python" {
        "Now rename the class to `Book`. Reply with the whole updated file only.".to_string()
    } else {
        "Now set \"log_level\" to \"debug\". Reply with the whole updated JSON only.".to_string()
    };
    json!([
        { "role": "system", "content": "You are a coding assistant. Reply with the complete file in a code block." },
        { "role": "user", "content": format!("Here is the file:\n```{kind}\n{file}```\n{first} Reply with the whole updated file only.") },
        { "role": "assistant", "content": format!("```{kind}\n{edited}```") },
        { "role": "user", "content": second },
    ])
}

const TOPICS: [&str; 6] = ["the river", "the harvest", "the bridge", "the market", "the school", "the storm"];

fn summary(k: usize) -> Value {
    let town = ["Alden", "Brisk", "Corvel", "Dunmore"][k % 4];
    let topic = TOPICS[k % 6];
    let sentences: Vec<String> = (0..6)
        .map(|i| {
            let t = TOPICS[(k + i) % 6];
            format!(
                "In {town}, {t} changed in year {} when {} people worked on it for {} weeks.",
                1900 + (k + i * 13) % 120,
                20 + (k + i) % 80,
                2 + i
            )
        })
        .collect();
    json!([{ "role": "user", "content": format!(
        "Read this report:\n\n{}\n\nQuote, word for word, every sentence of the report that mentions {topic}. Then summarize the report in one sentence.",
        sentences.join(" ")
    ) }])
}

fn chat(k: usize) -> Value {
    let subjects =
        ["a lighthouse keeper", "a lost robot", "a baker in Paris", "an old sailor", "a curious fox", "a chess player"];
    let asks = ["Write a short story about", "Describe a day in the life of", "Write a poem about", "Give advice to"];
    json!([{ "role": "user", "content": format!("{} {}.", asks[k % 4], subjects[(k / 4) % 6]) }])
}

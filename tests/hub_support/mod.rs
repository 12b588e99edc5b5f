//! A local stand-in for the Hugging Face Hub, enough of its HTTP surface for hf-hub: the
//! file listing (`/api/models/ORG/NAME/revision/REV?blobs=true`, with sizes and LFS
//! hashes) and file downloads (`/ORG/NAME/resolve/REV/FILE`, ranged, with the commit and
//! ETag headers). It can require a token, break one download part-way, list a wrong hash,
//! and records every request so tests can see what was fetched.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::json;
use sha2::{Digest, Sha256};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One file of a stand-in repository.
#[derive(Clone)]
pub struct HubFile {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    /// Served as an LFS file (listed with its SHA-256, which is its ETag).
    pub lfs: bool,
}

impl HubFile {
    pub fn new(name: &str, bytes: Vec<u8>, lfs: bool) -> HubFile {
        HubFile { name: name.to_string(), bytes: Arc::new(bytes), lfs }
    }

    fn sha256(&self) -> String {
        Sha256::digest(self.bytes.as_slice()).iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What the stand-in does besides serving files faithfully.
#[derive(Default)]
pub struct Quirks {
    /// Repositories that answer 401 without `Authorization: Bearer <token>`.
    pub gated: HashMap<String, String>,
    /// Break the first download of a range that starts at this offset: half its body
    /// is sent, then the connection closes.
    pub break_range_at: Option<u64>,
    /// List this SHA-256 for every LFS file instead of its own.
    pub wrong_hash: Option<String>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Vec<HubFile>>,
    quirks: Quirks,
    broke_once: bool,
    /// Every request: its path and its Range header.
    log: Vec<(String, Option<String>)>,
}

/// A running stand-in; it serves until the test process ends.
pub struct StandInHub {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

impl StandInHub {
    pub fn start(repos: Vec<(&str, Vec<HubFile>)>, quirks: Quirks) -> StandInHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let repos = repos.into_iter().map(|(name, files)| (name.to_string(), files)).collect();
        let state = Arc::new(Mutex::new(State { repos, quirks, ..State::default() }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        StandInHub { endpoint, state }
    }

    /// The Range headers of the downloads of `file` (not the listing), in order.
    pub fn ranges_of(&self, file: &str) -> Vec<String> {
        let log = &self.state.lock().unwrap().log;
        log.iter()
            .filter(|(path, _)| path.contains("/resolve/") && path.ends_with(&format!("/{file}")))
            .map(|(_, range)| range.clone().unwrap_or_default())
            .collect()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let range = headers.get("range").cloned();
    state.lock().unwrap().log.push((target.clone(), range.clone()));
    let path = target.split('?').next().unwrap_or("").to_string();
    let reply = respond(&path, range.as_deref(), headers.get("authorization").map(String::as_str), state);
    let mut stream = stream;
    let _ = stream.write_all(&reply.head);
    let _ = stream.write_all(&reply.body);
    let _ = stream.flush();
    // Drain what the client may still send, so closing does not reset the connection.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = reader.read(&mut [0u8; 64]);
}

struct Reply {
    head: Vec<u8>,
    body: Vec<u8>,
}

fn reply(status: &str, headers: &[(String, String)], body: Vec<u8>, declared: usize) -> Reply {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {declared}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    Reply { head: head.into_bytes(), body }
}

fn error(status: &str, message: &str) -> Reply {
    let body = json!({ "error": message }).to_string().into_bytes();
    let n = body.len();
    reply(status, &[("Content-Type".into(), "application/json".into())], body, n)
}

fn respond(path: &str, range: Option<&str>, auth: Option<&str>, state: &Mutex<State>) -> Reply {
    let mut state = state.lock().unwrap();
    let (repo, rest, listing) = match path.strip_prefix("/api/models/") {
        Some(rest) => match rest.split_once("/revision/") {
            Some((repo, _rev)) => (repo.to_string(), String::new(), true),
            None => return error("404 Not Found", "no such route"),
        },
        None => match path.trim_start_matches('/').split_once("/resolve/") {
            Some((repo, rest)) => (repo.to_string(), rest.to_string(), false),
            None => return error("404 Not Found", "no such route"),
        },
    };
    if let Some(token) = state.quirks.gated.get(&repo) {
        if auth != Some(format!("Bearer {token}").as_str()) {
            return error("401 Unauthorized", "gated repository");
        }
    }
    let Some(files) = state.repos.get(&repo).cloned() else {
        return error("404 Not Found", "Repository not found");
    };
    if listing {
        let wrong = state.quirks.wrong_hash.clone();
        let siblings: Vec<_> = files
            .iter()
            .map(|f| {
                let mut s = json!({ "rfilename": f.name, "size": f.bytes.len() });
                if f.lfs {
                    s["lfs"] = json!({ "sha256": wrong.clone().unwrap_or_else(|| f.sha256()), "size": f.bytes.len() });
                }
                s
            })
            .collect();
        let body = json!({ "id": repo, "sha": COMMIT, "siblings": siblings }).to_string().into_bytes();
        let n = body.len();
        return reply("200 OK", &[("Content-Type".into(), "application/json".into())], body, n);
    }
    let name = rest.split_once('/').map(|(_rev, name)| name).unwrap_or("");
    let Some(file) = files.iter().find(|f| f.name == name) else {
        return error("404 Not Found", "Entry not found");
    };
    let len = file.bytes.len() as u64;
    let etag = if file.lfs { file.sha256() } else { format!("{:040x}", file.bytes.len()) };
    let mut headers = vec![("x-repo-commit".to_string(), COMMIT.to_string()), ("ETag".into(), format!("\"{etag}\""))];
    if file.lfs {
        headers.push(("x-linked-etag".into(), format!("\"{etag}\"")));
        headers.push(("x-linked-size".into(), len.to_string()));
    }
    let (start, end) = parse_range(range, len);
    headers.push(("Content-Range".into(), format!("bytes {start}-{end}/{len}")));
    let body = file.bytes[start as usize..=end as usize].to_vec();
    let declared = body.len();
    if state.quirks.break_range_at == Some(start) && !state.broke_once {
        state.broke_once = true;
        let half = body[..body.len() / 2].to_vec();
        return reply("206 Partial Content", &headers, half, declared);
    }
    reply("206 Partial Content", &headers, body, declared)
}

/// `bytes=a-b`, clamped to the file as servers do (hf-hub asks one past the end).
fn parse_range(range: Option<&str>, len: u64) -> (u64, u64) {
    let last = len.saturating_sub(1);
    let Some(spec) = range.and_then(|r| r.strip_prefix("bytes=")) else { return (0, last) };
    let (a, b) = spec.split_once('-').unwrap_or((spec, ""));
    let start = a.parse().unwrap_or(0).min(last);
    let end = b.parse().unwrap_or(last).min(last);
    (start, end.max(start))
}

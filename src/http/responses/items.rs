//! `GET /v1/responses/{id}/input_items`: what went into a kept response (the kept turns of
//! its chain and its own input) as Responses items, newest first unless asked otherwise,
//! a page at a time (`limit`, `after`, `order`). Item ids name a position in the chain's
//! conversation, so an item keeps its id in every later response of the chain.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::http::error::ApiError;

const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 100;

/// The chat messages of a conversation as Responses items.
pub fn conversation_items(chain: &str, messages: &[Value]) -> Vec<Value> {
    let mut items = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let id = |prefix: &str, part: usize| item_id(prefix, chain, index, part);
        let content = message["content"].as_str().unwrap_or_default();
        match message["role"].as_str().unwrap_or_default() {
            "tool" => items.push(json!({ "id": id("fco", 0), "type": "function_call_output", "status": "completed",
                "call_id": message["tool_call_id"], "output": content })),
            "assistant" => {
                if !content.is_empty() {
                    items.push(json!({ "id": id("msg", 0), "type": "message", "status": "completed",
                        "role": "assistant",
                        "content": [{ "type": "output_text", "text": content, "annotations": [] }] }));
                }
                for (j, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
                    items.push(json!({ "id": id("fc", j + 1), "type": "function_call", "status": "completed",
                        "call_id": call["id"], "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"] }));
                }
            }
            role => items.push(json!({ "id": id("msg", 0), "type": "message", "status": "completed", "role": role,
                "content": [{ "type": "input_text", "text": content }] })),
        }
    }
    items
}

fn item_id(prefix: &str, chain: &str, index: usize, part: usize) -> String {
    let digest = Sha256::digest(format!("{chain}/{index}/{part}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

/// One page of `items` as the list object, for the request's query string.
pub fn page(mut items: Vec<Value>, query: &str) -> Result<Value, ApiError> {
    let (mut after, mut limit, mut descending) = (None, DEFAULT_LIMIT, true);
    for (key, value) in url_pairs(query)? {
        match key.as_str() {
            "after" => after = Some(value),
            "limit" => {
                limit = value.parse().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                    ApiError::bad_request(format!("`limit` must be an integer from 1 to {MAX_LIMIT}"), Some("limit"))
                })?
            }
            "order" => {
                descending = match value.as_str() {
                    "desc" => true,
                    "asc" => false,
                    _ => return Err(ApiError::bad_request("`order` must be `asc` or `desc`", Some("order"))),
                }
            }
            other => {
                return Err(ApiError::bad_request(
                    format!("`{other}`: this server does not know this parameter"),
                    Some(other),
                ))
            }
        }
    }
    if descending {
        items.reverse();
    }
    let start = match after {
        Some(id) => {
            1 + items.iter().position(|item| item["id"] == id.as_str()).ok_or_else(|| {
                ApiError::bad_request(format!("`after`: no input item {id:?} in this response"), Some("after"))
            })?
        }
        None => 0,
    };
    let rest = items.split_off(start.min(items.len()));
    let has_more = rest.len() > limit;
    let data: Vec<Value> = rest.into_iter().take(limit).collect();
    let first = data.first().map(|item| item["id"].clone()).unwrap_or(Value::Null);
    let last = data.last().map(|item| item["id"].clone()).unwrap_or(Value::Null);
    Ok(json!({ "object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more }))
}

/// The query string's pairs, percent-decoded (`include[]` arrives as `include%5B%5D`).
fn url_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    actix_web::web::Query::<Vec<(String, String)>>::from_query(query)
        .map(actix_web::web::Query::into_inner)
        .map_err(|e| ApiError::bad_request(format!("the query string cannot be read: {e}"), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<Value> {
        vec![
            json!({ "role": "user", "content": "Weather in Paris?" }),
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "id": "call_1", "type": "function",
                "function": { "name": "weather", "arguments": "{\"city\":\"Paris\"}" } }] }),
            json!({ "role": "tool", "tool_call_id": "call_1", "content": "sunny" }),
            json!({ "role": "assistant", "content": "It is sunny." }),
            json!({ "role": "user", "content": "Thanks" }),
        ]
    }

    #[test]
    fn messages_become_items_with_ids_stable_along_the_chain() {
        let items = conversation_items("resp_a", &conversation());
        let types: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["message", "function_call", "function_call_output", "message", "message"]);
        assert_eq!(items[1]["name"], "weather");
        assert_eq!((items[2]["call_id"].as_str(), items[2]["output"].as_str()), (Some("call_1"), Some("sunny")));
        assert_eq!(items[3]["content"][0]["type"], "output_text");
        assert_eq!(items[4]["content"][0]["type"], "input_text");
        let longer = conversation_items("resp_a", &[conversation(), conversation()].concat());
        assert_eq!(items[..], longer[..5], "an item keeps its id as the chain grows");
        assert_ne!(conversation_items("resp_b", &conversation())[0]["id"], items[0]["id"]);
    }

    #[test]
    fn pages_run_newest_first_by_default_and_follow_after() {
        let items = conversation_items("resp_a", &conversation());
        let ids: Vec<Value> = items.iter().map(|i| i["id"].clone()).collect();
        let first = page(items.clone(), "limit=2").unwrap();
        assert_eq!(first["data"].as_array().unwrap().len(), 2);
        assert_eq!((&first["first_id"], &first["last_id"], &first["has_more"]), (&ids[4], &ids[3], &json!(true)));
        let next = page(items.clone(), &format!("limit=2&after={}", ids[3].as_str().unwrap())).unwrap();
        assert_eq!((&next["first_id"], &next["last_id"]), (&ids[2], &ids[1]));
        let asc = page(items.clone(), "order=asc").unwrap();
        assert_eq!((&asc["first_id"], &asc["has_more"]), (&ids[0], &json!(false)));
        for (query, param) in
            [("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"), ("after=x", "after")]
        {
            let err = page(items.clone(), query).unwrap_err();
            assert!(err.to_string().contains(param), "{query}: {err}");
        }
        assert!(page(items, "include%5B%5D=message.input_image.image_url").is_err(), "include is refused by name");
    }
}

use super::*;
use tokenrouter_core::sched::batching::Threshold;
use tokenrouter_core::sched::{DraftLeg, FinishReason};
use tokenrouter_core::spec::{DraftSource, SpeculationMethod};

fn arrival(spec: bool) -> WireArrival {
    WireArrival {
        id: 42,
        spec: spec.then(|| WireSpec {
            prompt_len: 3,
            max_tokens: 64,
            sampling: SamplingParams {
                temperature: 0.7,
                top_k: 40,
                seed: 9,
                logprobs: Some(2),
                logit_bias: vec![(5, -3.5), (70_000, 100.0)],
                ..Default::default()
            },
            stop_ids: vec![151_643, 151_645],
            policy: PolicyDescriptor { name: "random".into(), params: serde_json::json!({"p": 0.2}) },
            speculation: Some(Speculation {
                method: Some(SpeculationMethod::Suffix),
                max_tokens: 6,
                prediction: vec![9, 151_643],
            }),
        }),
        start: 0,
        suffix: vec![1, 200, 151_935, 7],
        output_len: 1,
        policy_state: PolicyState { seed: u64::MAX, counters: vec![0, 3], values: vec![0.5, -1.25] },
        seen: vec![4, 0],
        draft: Some(match spec {
            true => DraftLeg::Ask { target: 1, tokens: 5 },
            false => DraftLeg::Answer { tokens: vec![3, 151_935] },
        }),
    }
}

fn round_trip(frame: Frame) {
    let bytes = frame.encode();
    assert_eq!(Frame::decode(&bytes), Ok(frame));
}

#[test]
fn every_frame_decodes_to_itself() {
    round_trip(Frame::Arrive { model: 1, arrival: arrival(true) });
    round_trip(Frame::Arrive { model: 1, arrival: arrival(false) });
    round_trip(Frame::Handoff { to: 0, arrival: arrival(false) });
    round_trip(Frame::Event(RequestEvent::Token {
        id: 1,
        index: 17,
        token: 151_000,
        model: 1,
        logprob: Some(-0.5),
        top_logprobs: vec![(3, -0.5), (9, -2.0)],
    }));
    round_trip(Frame::Event(RequestEvent::Token {
        id: 1,
        index: 0,
        token: 0,
        model: 0,
        logprob: None,
        top_logprobs: vec![],
    }));
    round_trip(Frame::Event(RequestEvent::Moved { id: 2, from: 1, to: 0 }));
    round_trip(Frame::Event(RequestEvent::Finished { id: 3, reason: FinishReason::Length }));
    round_trip(Frame::Event(RequestEvent::Finished { id: 3, reason: FinishReason::Stop }));
    round_trip(Frame::Event(RequestEvent::Failed { id: 4, message: "é out of KV".into() }));
    round_trip(Frame::Event(RequestEvent::OutOfService { id: 4, message: "model b is out of service".into() }));
    round_trip(Frame::Event(RequestEvent::CachedPrefix { id: 4, model: 1, tokens: 32 }));
    for source in [DraftSource::Prediction, DraftSource::Ngram, DraftSource::Suffix] {
        let verified = RequestEvent::Verified { id: 6, model: 1, first_index: 40, drafted: 8, accepted: 5, source };
        round_trip(Frame::Event(verified));
    }
    let policy_state = tokenrouter_core::policy::PolicyState { seed: 9, counters: vec![1, 2], values: vec![0.5] };
    let travel = tokenrouter_core::sched::Travel { policy_state, seen: vec![0, 17] };
    round_trip(Frame::Event(RequestEvent::Resume { id: 5, model: 1, output_len: 3, travel }));
    round_trip(Frame::Release(u64::MAX));
    round_trip(Frame::SetActive(16));
    round_trip(Frame::SetRule(RuleWire {
        thresholds: vec![Threshold::Fixed(2), Threshold::ByActive(vec![(1, 1), (8, 4)])],
        max_wait_us: Some(1500),
    }));
    round_trip(Frame::Ping { model: 1, nonce: 7 });
    round_trip(Frame::Pong(7));
    round_trip(Frame::StatsRequest { model: 1, nonce: 1 });
    round_trip(Frame::StatsReply { nonce: 1, json: b"{}".to_vec() });
    round_trip(Frame::Refused("busy".into()));
    round_trip(Frame::InjectPanic(1));
    round_trip(Frame::Hello(Hello {
        reply_group: "g".into(),
        models: vec![ModelInfoWire { name: "small".into(), hidden_size: 64, vocab_size: 1000 }],
        model: 0,
        policy_seed: 3,
    }));
}

#[test]
fn a_decode_step_costs_a_few_bytes() {
    // One committed token on the hot path: kind bytes, id, index, token, model, flags.
    let token = Frame::Event(RequestEvent::Token {
        id: 5,
        index: 100,
        token: 151_000,
        model: 1,
        logprob: None,
        top_logprobs: vec![],
    });
    assert!(token.encode().len() <= 14, "{} bytes", token.encode().len());
    // A return after one token elsewhere: a one-token suffix, no spec.
    let mut back = arrival(false);
    back.suffix = vec![151_000];
    back.start = 700;
    back.draft = None;
    assert!(Frame::Arrive { model: 1, arrival: back }.encode().len() <= 40);
}

#[test]
fn another_version_is_refused_by_name() {
    let mut bytes = Frame::Pong(1).encode();
    bytes[2] = WIRE_VERSION + 1;
    assert_eq!(Frame::decode(&bytes), Err(WireError::Version { got: WIRE_VERSION + 1 }));
    assert!(WireError::Version { got: 9 }.to_string().contains("same tokenrouter version"));
    assert_eq!(Frame::decode(b"xx\x01\x05"), Err(WireError::NotOurs));
}

#[test]
fn truncated_or_corrupt_frames_are_errors_not_panics() {
    let bytes = Frame::Arrive { model: 1, arrival: arrival(true) }.encode();
    for cut in 0..bytes.len() {
        assert!(Frame::decode(&bytes[..cut]).is_err(), "a frame cut at {cut} decoded");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(Frame::decode(&long), Err(WireError::Malformed("trailing bytes")));
    // A huge length prefix must not allocate: it is checked against what is left.
    let mut huge = Frame::Release(1).encode();
    huge[3] = 5; // a Handoff kind over a payload that claims a giant suffix
    huge.truncate(4);
    huge.extend_from_slice(&[1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert_eq!(Frame::decode(&huge), Err(WireError::Truncated));
    let mut bad_kind = Frame::Pong(1).encode();
    bad_kind[3] = 200;
    assert!(matches!(Frame::decode(&bad_kind), Err(WireError::Malformed(_))));
}

/// One frame of each kind, the control frames with their nested core types.
fn sample_frames() -> Vec<Frame> {
    let subserver = SubserverConfig::new(1, 2, 1000, 4096);
    let rule = BatchingRule {
        thresholds: vec![Threshold::Fixed(2), Threshold::ByActive(vec![(1, 1), (8, 4)])],
        max_wait: Some(Duration::from_micros(1500)),
    };
    vec![
        Frame::Hello(Hello {
            reply_group: "g".into(),
            models: vec![ModelInfoWire { name: "small".into(), hidden_size: 64, vocab_size: 1000 }],
            model: 0,
            policy_seed: 3,
        }),
        Frame::Welcome(Welcome {
            model: 1,
            block_size: 16,
            total_blocks: 512,
            free_blocks: 500,
            vocab_size: 1000,
            hidden_size: 64,
            num_layers: 4,
        }),
        Frame::Refused("busy".into()),
        Frame::Start(StartWire::from_engine(&subserver, &rule)),
        Frame::Arrive { model: 1, arrival: arrival(true) },
        Frame::Handoff { to: 0, arrival: arrival(false) },
        Frame::Event(RequestEvent::Token {
            id: 1,
            index: 17,
            token: 151_000,
            model: 1,
            logprob: Some(-0.5),
            top_logprobs: vec![(3, -0.5)],
        }),
        Frame::Release(7),
        Frame::SetActive(16),
        Frame::SetRule(RuleWire::from_engine(&rule)),
        Frame::StatsRequest { model: 1, nonce: 1 },
        Frame::StatsReply { nonce: 1, json: b"{}".to_vec() },
        Frame::Ping { model: 1, nonce: 7 },
        Frame::Pong(7),
        Frame::InjectPanic(1),
    ]
}

#[test]
fn control_frames_carry_the_engine_settings() {
    for frame in sample_frames() {
        round_trip(frame);
    }
    let Frame::Start(start) = sample_frames().swap_remove(3) else { panic!("frame 3 is Start") };
    let (subserver, rule) = start.to_engine();
    assert_eq!(subserver, SubserverConfig::new(1, 2, 1000, 4096));
    assert_eq!(rule.max_wait, Some(Duration::from_micros(1500)));
}

#[test]
fn garbage_and_every_truncation_are_errors_not_panics() {
    for frame in sample_frames() {
        let bytes = frame.encode();
        for cut in 0..bytes.len() {
            assert!(Frame::decode(&bytes[..cut]).is_err(), "{frame:?} cut at {cut} decoded");
        }
    }
    // Pseudo-random bytes (xorshift, fixed seed): without our header they are refused;
    // behind a valid header and kind they must decode or fail, never panic, and what
    // decodes must encode to a frame that decodes again.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_byte = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    };
    for round in 0..2000 {
        let garbage: Vec<u8> = (0..round % 64).map(|_| next_byte()).collect();
        if !garbage.starts_with(b"TR") {
            assert!(Frame::decode(&garbage).is_err(), "garbage {garbage:?} decoded");
        }
        let kind = (round % 17) as u8; // every kind, and two past the last
        let framed: Vec<u8> = [b'T', b'R', WIRE_VERSION, kind].into_iter().chain(garbage).collect();
        if let Ok(frame) = Frame::decode(&framed) {
            assert!(Frame::decode(&frame.encode()).is_ok(), "{frame:?} does not survive a re-encode");
        }
    }
    let mut past_the_last_kind = Frame::Pong(1).encode();
    past_the_last_kind[3] = 15;
    assert!(matches!(Frame::decode(&past_the_last_kind), Err(WireError::Malformed(_))));
}

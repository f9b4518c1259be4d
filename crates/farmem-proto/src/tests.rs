//! Round trips of every message, and the decoder under garbage, truncated, mutated and
//! oversized input: it must return an error or "need more", never panic, never accept a
//! frame longer than its kind allows.

use proptest::prelude::*;

use crate::*;

/// Decode a whole encoded frame (header and body).
fn decode_all(buf: &[u8]) -> Result<Option<(Header, Frame<'_>)>, ProtoError> {
    match split_frame(buf)? {
        None => Ok(None),
        Some((h, n)) => {
            assert_eq!(n, buf.len(), "one frame exactly");
            Ok(Some((h, decode(&h, &buf[HEADER_LEN..n])?)))
        }
    }
}

fn pages(n: usize, seed: u8) -> Vec<u8> {
    (0..n * PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn class_strategy() -> impl Strategy<Value = IoClass> {
    prop_oneof![
        Just(IoClass::Demand),
        Just(IoClass::Prefetch),
        Just(IoClass::WriteBack)
    ]
}

fn keys_strategy(max: usize) -> impl Strategy<Value = Vec<PageKey>> {
    prop::collection::vec(
        (any::<u32>(), any::<u64>()).prop_map(|(region, page)| PageKey { region, page }),
        1..=max,
    )
}

fn tenant_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,64}"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn hello_round_trips(tenant in tenant_strategy(), session in any::<[u8; 16]>(),
                         nonce in any::<[u8; 32]>(), resume in any::<bool>(),
                         lo in 1u16..5, span in 0u16..5,
                         share in proptest::option::of(any::<[u8; 32]>())) {
        let h = Hello { min_version: lo, max_version: lo + span, session, nonce, resume,
                        tenant: &tenant, share };
        let mut out = Vec::new();
        encode_hello(&mut out, &h);
        let (_, f) = decode_all(&out).unwrap().unwrap();
        prop_assert_eq!(f, Frame::Hello(h));
    }

    #[test]
    fn handshake_replies_round_trip(nonce in any::<[u8; 32]>(), instance in any::<u64>(),
                                    version in any::<u16>(), resumed in any::<bool>(),
                                    nums in any::<[u64; 3]>(), batch in any::<u32>(),
                                    window in any::<u32>(),
                                    share in proptest::option::of(any::<[u8; 32]>()),
                                    session_proof in proptest::option::of(any::<[u8; 32]>())) {
        let mut out = Vec::new();
        let c = Challenge { version, nonce, instance, share };
        encode_challenge(&mut out, &c);
        prop_assert_eq!(decode_all(&out).unwrap().unwrap().1, Frame::Challenge(c));
        out.clear();
        let a = Auth { proof: nonce, session_proof };
        encode_auth(&mut out, &a);
        prop_assert_eq!(decode_all(&out).unwrap().unwrap().1, Frame::Auth(a));
        out.clear();
        let w = Welcome { proof: nonce, resumed, session_pages: nums[0], quota_pages: nums[1],
                          capacity_pages: nums[2], max_batch: batch, window_pages: window };
        encode_welcome(&mut out, &w);
        prop_assert_eq!(decode_all(&out).unwrap().unwrap().1, Frame::Welcome(w));
    }

    #[test]
    fn read_round_trips(id in any::<u64>(), class in class_strategy(), keys in keys_strategy(64)) {
        let mut out = Vec::new();
        encode_read(&mut out, id, class, &keys);
        let (h, f) = decode_all(&out).unwrap().unwrap();
        prop_assert_eq!((h.id, h.class, h.kind), (id, class, Kind::Read));
        let Frame::Read(r) = f else { panic!("not a read") };
        prop_assert_eq!(r.keys().collect::<Vec<_>>(), keys);
    }

    #[test]
    fn write_round_trips_and_checksums_hold(id in any::<u64>(), keys in keys_strategy(8),
                                            seed in any::<u8>()) {
        let data = pages(keys.len(), seed);
        let mut out = Vec::new();
        encode_write_head(&mut out, id, IoClass::WriteBack, &keys, &data);
        out.extend_from_slice(&data);
        let (h, f) = decode_all(&out).unwrap().unwrap();
        prop_assert_eq!(h.id, id);
        let Frame::Write(w) = f else { panic!("not a write") };
        prop_assert_eq!(w.len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            prop_assert_eq!(w.key(i), *k);
            prop_assert_eq!(w.page(i), &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
        }
        prop_assert_eq!(w.first_bad_page(), None);
    }

    #[test]
    fn responses_round_trip(id in any::<u64>(), n in 1usize..6, seed in any::<u8>(),
                            a in any::<u64>(), b in any::<u64>(), c in any::<u32>(),
                            msg in "\\PC{0,80}") {
        let data = pages(n, seed);
        let crcs: Vec<u32> = data.chunks(PAGE_SIZE).map(page_crc).collect();
        let mut out = Vec::new();
        encode_read_ok_head(&mut out, id, IoClass::Prefetch, &crcs);
        out.extend_from_slice(&data);
        prop_assert_eq!(read_ok_pages(out.len() as u32 - HEADER_LEN as u32), Some(n));
        let (_, f) = decode_all(&out).unwrap().unwrap();
        let Frame::ReadOk(r) = f else { panic!("not ReadOk") };
        for i in 0..n {
            prop_assert_eq!(r.crc(i), page_crc(r.page(i)));
        }
        let cases: Vec<(Vec<u8>, Frame)> = vec![
            ({ let mut o = Vec::new(); encode_write_ok(&mut o, id, IoClass::WriteBack,
                 &WriteOk { new_pages: c, session_pages: a }); o },
             Frame::WriteOk(WriteOk { new_pages: c, session_pages: a })),
            ({ let mut o = Vec::new(); encode_free_ok(&mut o, id,
                 &FreeOk { freed: a, session_pages: b }); o },
             Frame::FreeOk(FreeOk { freed: a, session_pages: b })),
            ({ let mut o = Vec::new(); encode_stats_ok(&mut o, id, &StatsOk {
                 session_pages: a, tenant_pages: b, quota_pages: 1, server_pages: 2,
                 capacity_pages: 3 }); o },
             Frame::StatsOk(StatsOk { session_pages: a, tenant_pages: b, quota_pages: 1,
                 server_pages: 2, capacity_pages: 3 })),
            ({ let mut o = Vec::new(); encode_free(&mut o, id,
                 &FreeReq { region: c, first: a, count: b | 1 }); o },
             Frame::Free(FreeReq { region: c, first: a, count: b | 1 })),
            ({ let mut o = Vec::new(); encode_error(&mut o, id, IoClass::Demand,
                 ErrorCode::NotFound, &msg); o },
             Frame::Error(ErrorMsg { code: ErrorCode::NotFound, message: &msg })),
            ({ let mut o = Vec::new(); encode_empty(&mut o, Kind::Stats, id); o }, Frame::Stats),
            ({ let mut o = Vec::new(); encode_empty(&mut o, Kind::Close, id); o }, Frame::Close),
            ({ let mut o = Vec::new(); encode_goodbye(&mut o, id,
                 &Goodbye { free_at_close: c % 2 == 1 }); o },
             Frame::Goodbye(Goodbye { free_at_close: c % 2 == 1 })),
            ({ let mut o = Vec::new(); encode_empty(&mut o, Kind::GoodbyeOk, id); o },
             Frame::GoodbyeOk),
        ];
        for (bytes, want) in cases {
            let (h, got) = decode_all(&bytes).unwrap().unwrap();
            prop_assert_eq!(h.id, id);
            prop_assert_eq!(got, want);
        }
    }

    /// Random bytes: an error or "need more", never a panic; and never a frame whose body
    /// exceeds its kind's limit.
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        match split_frame(&bytes) {
            Ok(Some((h, n))) => {
                prop_assert!(h.len as usize <= h.kind.max_body());
                let _ = decode(&h, &bytes[HEADER_LEN..n]);
            }
            Ok(None) => {}
            Err(_) => {}
        }
    }

    /// A valid header of every kind with a random body: the body decoder must cope.
    #[test]
    fn random_bodies_never_panic(kind in prop::sample::select(vec![
            Kind::Hello, Kind::Challenge, Kind::Auth, Kind::Welcome, Kind::Read, Kind::Write,
            Kind::Free, Kind::Stats, Kind::Close, Kind::Goodbye, Kind::ReadOk, Kind::WriteOk,
            Kind::FreeOk, Kind::StatsOk, Kind::GoodbyeOk, Kind::Error]),
            body in prop::collection::vec(any::<u8>(), 0..400)) {
        let len = body.len().min(kind.max_body());
        let mut out = Vec::new();
        Header::new(kind, IoClass::Prefetch, 5, len).encode(&mut out);
        out.extend_from_slice(&body[..len]);
        let (h, n) = split_frame(&out).unwrap().unwrap();
        let _ = decode(&h, &out[HEADER_LEN..n]);
    }

    /// Every prefix of a valid frame is "need more"; never an error, never a frame.
    #[test]
    fn truncated_frames_wait_for_more(keys in keys_strategy(16), cut in any::<prop::sample::Index>()) {
        let mut out = Vec::new();
        encode_read(&mut out, 7, IoClass::Demand, &keys);
        let at = cut.index(out.len());
        prop_assert_eq!(split_frame(&out[..at]), Ok(None));
    }

    /// A valid frame with one byte changed decodes to something valid or to an error, and a
    /// changed page byte in a Write is caught by its checksum.
    #[test]
    fn mutated_frames_never_panic(keys in keys_strategy(4), pos in any::<prop::sample::Index>(),
                                  val in any::<u8>()) {
        let data = pages(keys.len(), 9);
        let mut out = Vec::new();
        encode_write_head(&mut out, 1, IoClass::WriteBack, &keys, &data);
        let head_len = out.len();
        out.extend_from_slice(&data);
        let at = pos.index(out.len());
        let changed = out[at] != val;
        out[at] = val;
        if let Ok(Some((h, n))) = split_frame(&out) {
            if let Ok(Frame::Write(w)) = decode(&h, &out[HEADER_LEN..n]) {
                if changed && at >= head_len {
                    prop_assert!(w.first_bad_page().is_some(), "corrupted page accepted");
                }
            }
        }
    }
}

#[test]
fn oversized_frames_are_refused_from_the_header() {
    for kind in [
        Kind::Hello,
        Kind::Read,
        Kind::Write,
        Kind::Stats,
        Kind::Error,
    ] {
        let mut out = Vec::new();
        Header::new(kind, IoClass::Demand, 1, kind.max_body() + 1).encode(&mut out);
        assert!(
            matches!(split_frame(&out), Err(ProtoError::Oversized { .. })),
            "{kind:?}"
        );
    }
    let mut out = Vec::new();
    Header::new(Kind::Write, IoClass::Demand, 1, 0).encode(&mut out);
    out[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        split_frame(&out),
        Err(ProtoError::Oversized { .. })
    ));
}

#[test]
fn malformed_headers_and_bodies_are_refused() {
    let mut out = Vec::new();
    encode_read(
        &mut out,
        1,
        IoClass::Demand,
        &[PageKey { region: 1, page: 2 }],
    );
    let mut bad = out.clone();
    bad[4] = 99;
    assert_eq!(split_frame(&bad), Err(ProtoError::UnknownKind(99)));
    let mut bad = out.clone();
    bad[5] = 3;
    assert_eq!(split_frame(&bad), Err(ProtoError::BadClass(3)));
    let mut bad = out.clone();
    bad[6] = 1;
    assert_eq!(split_frame(&bad), Err(ProtoError::Flags(1)));
    // A count that disagrees with the body length.
    let mut bad = out.clone();
    bad[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&2u32.to_le_bytes());
    let (h, n) = split_frame(&bad).unwrap().unwrap();
    assert!(decode(&h, &bad[HEADER_LEN..n]).is_err());
    // Zero pages.
    let mut zero = Vec::new();
    Header::new(Kind::Read, IoClass::Demand, 1, 4).encode(&mut zero);
    zero.extend_from_slice(&0u32.to_le_bytes());
    let (h, n) = split_frame(&zero).unwrap().unwrap();
    assert!(decode(&h, &zero[HEADER_LEN..n]).is_err());
    // A Hello with the wrong magic, and one with a tenant name that needs escaping.
    let mut hello = Vec::new();
    encode_hello(
        &mut hello,
        &Hello {
            min_version: 1,
            max_version: 1,
            session: [0; 16],
            nonce: [0; 32],
            resume: false,
            tenant: "a",
            share: None,
        },
    );
    let mut bad = hello.clone();
    bad[HEADER_LEN] = b'X';
    let (h, n) = split_frame(&bad).unwrap().unwrap();
    assert_eq!(decode(&h, &bad[HEADER_LEN..n]), Err(ProtoError::BadMagic));
    let mut bad = hello.clone();
    *bad.last_mut().unwrap() = b'\n';
    let (h, n) = split_frame(&bad).unwrap().unwrap();
    assert!(decode(&h, &bad[HEADER_LEN..n]).is_err());
    assert!(!valid_tenant("a b") && !valid_tenant("") && valid_tenant("team-1.prod_x"));
}

#[test]
fn error_messages_are_cut_at_a_character_boundary() {
    let long = "é".repeat(MAX_ERROR_LEN);
    let mut out = Vec::new();
    encode_error(&mut out, 3, IoClass::Demand, ErrorCode::BadRequest, &long);
    let (_, f) = decode_all(&out).unwrap().unwrap();
    let Frame::Error(e) = f else {
        panic!("not an error")
    };
    assert!(e.message.len() <= MAX_ERROR_LEN && e.message.chars().all(|c| c == 'é'));
}

#[test]
fn read_ok_page_count_from_length() {
    assert_eq!(read_ok_pages(4 + READ_OK_PAGE_LEN as u32), Some(1));
    assert_eq!(read_ok_pages(4 + 3 * READ_OK_PAGE_LEN as u32), Some(3));
    assert_eq!(read_ok_pages(5 + READ_OK_PAGE_LEN as u32), None);
    assert_eq!(read_ok_pages(4), None);
    assert_eq!(read_ok_pages(0), None);
}

#[test]
fn a_prefetch_read_carries_its_deadline_and_nothing_else_may() {
    let keys = [PageKey { region: 3, page: 9 }];
    let mut out = Vec::new();
    encode_read_useful_for(&mut out, 7, IoClass::Prefetch, &keys, 125);
    let (h, n) = split_frame(&out).unwrap().unwrap();
    assert_eq!(n, out.len());
    assert_eq!(h.useful_for, 125);
    assert_eq!(
        h.useful_for(),
        Some(std::time::Duration::from_micros(125 * USEFUL_FOR_UNIT_US))
    );
    // Without a deadline the field is zero, as version 1 requires.
    let mut plain = Vec::new();
    encode_read(&mut plain, 7, IoClass::Prefetch, &keys);
    assert_eq!(split_frame(&plain).unwrap().unwrap().0.useful_for(), None);
    assert_eq!(plain[6..8], [0, 0]);
    // The same field on a demand read (or any other frame) is refused.
    let mut bad = Vec::new();
    encode_read(&mut bad, 7, IoClass::Demand, &keys);
    bad[6] = 5;
    assert_eq!(split_frame(&bad), Err(ProtoError::Flags(5)));
    assert_eq!(
        ErrorCode::from_u16(ErrorCode::Late as u16),
        Some(ErrorCode::Late)
    );
}

#[test]
fn goodbye_is_a_version_3_request_with_one_flag_byte() {
    const { assert!(VERSION_MAX >= VERSION_GOODBYE) };
    assert_eq!(VERSION_GOODBYE, 3);
    assert_eq!((Kind::Goodbye as u8, Kind::GoodbyeOk as u8), (21, 36));
    assert!(Kind::Goodbye.is_request() && Kind::GoodbyeOk.is_response());
    for free_at_close in [false, true] {
        let mut out = Vec::new();
        encode_goodbye(&mut out, 9, &Goodbye { free_at_close });
        assert_eq!(out.len(), HEADER_LEN + 1);
        assert_eq!(out[HEADER_LEN], free_at_close as u8);
        let (h, f) = decode_all(&out).unwrap().unwrap();
        assert_eq!((h.id, h.kind), (9, Kind::Goodbye));
        assert_eq!(f, Frame::Goodbye(Goodbye { free_at_close }));
    }
    // A flag other than 0 or 1, an empty body, and a longer one are refused.
    let mut bad = Vec::new();
    encode_goodbye(
        &mut bad,
        1,
        &Goodbye {
            free_at_close: true,
        },
    );
    bad[HEADER_LEN] = 2;
    let (h, n) = split_frame(&bad).unwrap().unwrap();
    assert!(matches!(
        decode(&h, &bad[HEADER_LEN..n]),
        Err(ProtoError::Malformed {
            kind: Kind::Goodbye,
            ..
        })
    ));
    let mut empty = Vec::new();
    Header::new(Kind::Goodbye, IoClass::Demand, 1, 0).encode(&mut empty);
    let (h, n) = split_frame(&empty).unwrap().unwrap();
    assert!(decode(&h, &empty[HEADER_LEN..n]).is_err());
    let mut long = Vec::new();
    Header::new(Kind::Goodbye, IoClass::Demand, 1, 2).encode(&mut long);
    long.extend([1, 0]);
    assert!(matches!(
        split_frame(&long),
        Err(ProtoError::Oversized {
            kind: Kind::Goodbye,
            ..
        })
    ));
    // The reply has no body: one byte is refused from its header.
    let mut ok = Vec::new();
    Header::new(Kind::GoodbyeOk, IoClass::Demand, 1, 1).encode(&mut ok);
    ok.push(0);
    assert!(matches!(
        split_frame(&ok),
        Err(ProtoError::Oversized {
            kind: Kind::GoodbyeOk,
            ..
        })
    ));
}

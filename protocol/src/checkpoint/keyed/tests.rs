use super::*;

fn file(path: &str, size: u64) -> StateFile {
    StateFile { path: path.into(), size, crc32: 7 }
}

fn seg(path: &str, offset: u64, length: u64) -> KeyGroupSegment {
    KeyGroupSegment { file: path.into(), offset, length, crc32: 1 }
}

/// Key groups 0..3 in one 30-byte file, 10 bytes each, and key group 9 in a shared file.
fn good() -> KeyedStateHandle {
    KeyedStateHandle {
        key_groups: BTreeMap::from([
            (0, seg("chk-2/op-0.state", 0, 10)),
            (1, seg("chk-2/op-0.state", 10, 10)),
            (2, seg("chk-2/op-0.state", 20, 10)),
            (9, seg("shared/op-0-ab.state", 4, 3)),
        ]),
        files: vec![file("chk-2/op-0.state", 30), file("shared/op-0-ab.state", 7)],
    }
}

fn with(f: impl FnOnce(&mut KeyedStateHandle)) -> Result<(), HandleError> {
    let mut h = good();
    f(&mut h);
    h.validate()
}

#[test]
fn a_consistent_handle_is_valid() {
    assert_eq!(good().validate(), Ok(()));
    assert_eq!(KeyedStateHandle::default().validate(), Ok(()));
    assert_eq!(good().segment_bytes(), 33);
    assert!(good().key_groups[&9].is_shared() && !good().key_groups[&0].is_shared());
}

#[test]
fn every_inconsistency_is_a_precise_error() {
    assert_eq!(
        with(|h| h.files[1].path = "../shared/x".into()),
        Err(HandleError::UnsafePath { path: "../shared/x".into() })
    );
    assert_eq!(
        with(|h| h.files.push(file("chk-2/op-0.state", 30))),
        Err(HandleError::DuplicateFile { path: "chk-2/op-0.state".into() })
    );
    assert_eq!(
        with(|h| {
            h.key_groups.insert(5, seg("chk-2/other", 0, 1));
        }),
        Err(HandleError::UnlistedFile { key_group: 5, path: "chk-2/other".into() })
    );
    assert_eq!(
        with(|h| h.key_groups.get_mut(&1).unwrap().length = 0),
        Err(HandleError::EmptySegment { key_group: 1, path: "chk-2/op-0.state".into() })
    );
    assert_eq!(
        with(|h| h.key_groups.get_mut(&2).unwrap().offset = u64::MAX),
        Err(HandleError::SegmentOverflow {
            key_group: 2,
            path: "chk-2/op-0.state".into(),
            offset: u64::MAX,
            length: 10
        })
    );
    assert_eq!(
        with(|h| h.files[0].size = 29),
        Err(HandleError::SegmentOutsideFile {
            key_group: 2,
            path: "chk-2/op-0.state".into(),
            offset: 20,
            end: 30,
            size: 29
        })
    );
    assert_eq!(
        with(|h| h.key_groups.get_mut(&2).unwrap().offset = 15),
        Err(HandleError::OverlappingSegments { first: 1, second: 2, path: "chk-2/op-0.state".into() })
    );
    assert_eq!(
        with(|h| h.files.push(file("shared/op-0-cd.state", 5))),
        Err(HandleError::UnusedFile { path: "shared/op-0-cd.state".into() })
    );
}

#[test]
fn restriction_keeps_the_files_of_the_kept_key_groups() {
    let h = good();
    let low = h.restricted_to(KeyGroupRange { start: 1, end: 4 });
    assert_eq!(low.key_groups.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(low.files, vec![file("chk-2/op-0.state", 30)]);
    assert_eq!(low.validate(), Ok(()));
    let high = h.restricted_to(KeyGroupRange { start: 5, end: 127 });
    assert_eq!(high.files, vec![file("shared/op-0-ab.state", 7)]);
    assert!(h.restricted_to(KeyGroupRange { start: 3, end: 8 }).is_empty());
}

#[test]
fn handles_round_trip_through_json_in_the_current_shape() {
    let json = serde_json::to_value(good()).unwrap();
    assert!(json.get("key_groups").is_some() && json.get("files").is_some(), "{json}");
    let back: KeyedStateHandle = serde_json::from_value(json).unwrap();
    assert_eq!(back, good());
    let empty: KeyedStateHandle = serde_json::from_str(r#"{"key_groups":{},"files":[]}"#).unwrap();
    assert!(empty.is_empty());
}

#[test]
fn the_former_shape_decodes_as_whole_file_segments() {
    let json = r#"{
        "0": {"path": "chk-1/op-kg-0.state", "size": 12, "crc32": 5},
        "7": {"path": "shared/op-kg-7-ff.state", "size": 20, "crc32": 6}
    }"#;
    let h: KeyedStateHandle = serde_json::from_str(json).unwrap();
    assert_eq!(
        h.key_groups[&0],
        KeyGroupSegment { file: "chk-1/op-kg-0.state".into(), offset: 0, length: 12, crc32: 5 }
    );
    assert_eq!(h.key_groups[&7].file, "shared/op-kg-7-ff.state");
    assert_eq!(
        h.files,
        vec![
            StateFile { path: "chk-1/op-kg-0.state".into(), size: 12, crc32: 5 },
            StateFile { path: "shared/op-kg-7-ff.state".into(), size: 20, crc32: 6 }
        ]
    );
    assert_eq!(h.validate(), Ok(()));
    let empty: KeyedStateHandle = serde_json::from_str("{}").unwrap();
    assert!(empty.is_empty());
}

#[test]
fn malformed_handles_are_decode_errors() {
    for json in [
        r#"{"key_groups":{}}"#,
        r#"{"key_groups":{},"files":[],"extra":1}"#,
        r#"{"x":{"path":"a","size":1,"crc32":0}}"#,
        r#"{"key_groups":{"-1":{"file":"a","offset":0,"length":1,"crc32":0}},"files":[]}"#,
        r#"[]"#,
    ] {
        assert!(serde_json::from_str::<KeyedStateHandle>(json).is_err(), "{json}");
    }
}

#[test]
fn whole_file_key_groups_are_added_and_removed_with_their_files() {
    let mut h = KeyedStateHandle::default();
    h.insert_whole_file(4, file("chk-1/b", 5));
    h.insert_whole_file(2, file("chk-1/a", 3));
    assert_eq!(h.files, vec![file("chk-1/a", 3), file("chk-1/b", 5)]);
    assert_eq!(h.key_groups[&2], KeyGroupSegment { file: "chk-1/a".into(), offset: 0, length: 3, crc32: 7 });
    assert_eq!(h.validate(), Ok(()));
    assert_eq!(h.remove_key_group(4).map(|s| s.file), Some("chk-1/b".into()));
    assert_eq!(h.files, vec![file("chk-1/a", 3)]);
    assert_eq!(h.remove_key_group(4), None);
    let mut shared = good();
    shared.remove_key_group(0);
    assert_eq!(shared.files.len(), 2, "the file still holds key groups 1 and 2");
    assert_eq!(shared.validate(), Ok(()));
}

//! The protobuf field splitter on any bytes: never a crash, and when it reads a message, what it
//! returns is consistent (the field is gone from the rest, and putting it back gives it again).
//! The reader of a stored audit's prompt on the same bytes: never a crash, and a prompt it reads
//! left something out.
#![no_main]

use contextshift_core::audit_blocks::{previous_prompt, AuditFields};
use contextshift_core::wire::{put_bytes, split_field};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, message)) = data.split_first() else { return };
    let field = u32::from(selector % 16) + 1;
    let at = AuditFields { blocks: field, summary_id: &[6, 18, 1] };
    if let Ok(Some(prompt)) = previous_prompt(message, &at) {
        assert!(!prompt.excluded.is_empty());
    }
    let Ok(split) = split_field(message, field) else { return };
    let taken = split.value.map_or(0, <[u8]>::len);
    assert!(split.rest.len() + taken <= message.len());
    // The rest holds no occurrence of the field, and is itself well framed.
    let again = split_field(&split.rest, field).expect("the rest of a readable message is readable");
    assert_eq!((again.rest.as_slice(), again.value), (split.rest.as_slice(), None));
    // The field put back at the end is read as the last occurrence.
    if let Some(value) = split.value {
        let mut rebuilt = split.rest.clone();
        put_bytes(&mut rebuilt, field, value);
        let back = split_field(&rebuilt, field).expect("a rebuilt message is readable");
        assert_eq!((back.rest, back.value), (split.rest.clone(), Some(value)));
    }
});

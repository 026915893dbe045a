//! The rate-limit fields as a client reads them: with `sfv`, an RFC 9651
//! Structured Fields parser someone else wrote.

/// A field's items with every parameter as `sfv` decodes it; panics when
/// the field is not a List of String Items (the draft's shape).
pub fn items(value: &str) -> Vec<(String, sfv::Parameters)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?}: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("an inner list in {value:?}")
            };
            let name = item
                .bare_item
                .as_string()
                .expect("a String item")
                .as_str()
                .to_owned();
            (name, item.params)
        })
        .collect()
}

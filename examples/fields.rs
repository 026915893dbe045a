//! The rate-limit fields of a response as a client reads them: parsed with
//! `sfv` (an RFC 9651 Structured Fields parser the project did not write)
//! and checked against the shapes draft-ietf-httpapi-ratelimit-headers
//! gives them. Every reply a [`SelfTest`](crate::SelfTest) row shows goes
//! through [`check`].

use http::HeaderMap;

/// The problem type of a 429 for a spent quota.
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// One field's items: each name and its parameters.
type Items = Vec<(String, sfv::Parameters)>;

/// What is wrong with the rate-limit fields of a response (`status`,
/// `headers`, `body`), if anything:
///
/// * `RateLimit-Policy`: a non-empty List of Items whose values are Strings,
///   distinct, each with a non-negative Integer `q`; `w`, when present, a
///   positive Integer; `qu` a String; `pk` a Byte Sequence;
/// * `RateLimit`: a List of String Items naming policies of
///   `RateLimit-Policy`, each with a non-negative Integer `r`; `t`, when
///   present, a non-negative Integer; `pk` a Byte Sequence;
/// * on a 429, `Retry-After` is whole seconds (at least 1) and never earlier
///   than any item's `t`, and a `problem+json` body of the `quota-exceeded`
///   type names in `violated-policies` only policies of the field.
pub fn check(status: u16, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let policy = field(headers, "ratelimit-policy")?;
    let state = field(headers, "ratelimit")?;
    if let Some(policy) = &policy {
        if policy.is_empty() {
            return Err("RateLimit-Policy is an empty list".into());
        }
        for (i, (name, params)) in policy.iter().enumerate() {
            if policy[..i].iter().any(|(other, _)| other == name) {
                return Err(format!("RateLimit-Policy names {name:?} twice"));
            }
            integer(params, "q", name, true, 0)?;
            integer(params, "w", name, false, 1)?;
            if params.get("qu").is_some_and(|v| v.as_string().is_none()) {
                return Err(format!("{name:?}: qu is not a String"));
            }
            byte_sequence(params, name)?;
        }
    }
    let mut latest_t = 0;
    if let Some(state) = &state {
        for (name, params) in state {
            if unknown(&policy, name) {
                return Err(format!(
                    "RateLimit names {name:?}, which RateLimit-Policy does not"
                ));
            }
            integer(params, "r", name, true, 0)?;
            latest_t = latest_t.max(integer(params, "t", name, false, 0)?.unwrap_or(0));
            byte_sequence(params, name)?;
        }
    }
    if status != 429 {
        return Ok(());
    }
    if let Some(retry) = headers.get("retry-after") {
        let retry: i64 = retry
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|secs| *secs >= 1)
            .ok_or_else(|| format!("Retry-After {retry:?} is not whole seconds >= 1"))?;
        if retry < latest_t {
            return Err(format!("Retry-After {retry} is earlier than a t of {latest_t}"));
        }
    }
    let problem = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !problem {
        return Ok(());
    }
    let body: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("a problem+json body that is not JSON: {e}"))?;
    if body["type"] != QUOTA_EXCEEDED {
        return Ok(());
    }
    let violated = body["violated-policies"]
        .as_array()
        .ok_or("a quota-exceeded problem without a violated-policies array")?;
    if violated.is_empty() {
        return Err("violated-policies is empty".into());
    }
    for name in violated {
        let name = name.as_str().ok_or("violated-policies holds a non-string")?;
        if unknown(&policy, name) {
            return Err(format!(
                "violated-policies names {name:?}, which RateLimit-Policy does not"
            ));
        }
    }
    Ok(())
}

/// The parameters of the item `name` of the field `field_name`
/// (`ratelimit-policy` or `ratelimit`) as `sfv` parsed them, written
/// `r=985;t=1` (Integers as numbers, Strings quoted, other values `?`);
/// `None` when the field is absent, is not a List of String Items, or does
/// not name the item.
pub fn item(headers: &HeaderMap, field_name: &str, name: &str) -> Option<String> {
    let items = field(headers, field_name).ok()??;
    let (_, params) = items.into_iter().find(|(item, _)| item == name)?;
    let written: Vec<String> = params
        .iter()
        .map(|(key, value)| {
            let value = match (value.as_integer(), value.as_string()) {
                (Some(n), _) => i64::from(n).to_string(),
                (_, Some(s)) => format!("{:?}", s.as_str()),
                _ => "?".into(),
            };
            format!("{}={value}", key.as_str())
        })
        .collect();
    Some(written.join(";"))
}

/// Whether `name` is not an item of a `RateLimit-Policy` that is present.
fn unknown(policy: &Option<Items>, name: &str) -> bool {
    policy
        .as_ref()
        .is_some_and(|items| !items.iter().any(|(p, _)| p == name))
}

/// A field (all its lines, joined as RFC 9110 allows) parsed as a List of
/// String Items, or `None` when absent.
fn field(headers: &HeaderMap, name: &str) -> Result<Option<Items>, String> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().map_err(|_| format!("{name} is not visible ASCII")))
        .collect::<Result<_, _>>()?;
    if lines.is_empty() {
        return Ok(None);
    }
    let joined = lines.join(", ");
    let list: sfv::List = sfv::Parser::new(&joined)
        .parse()
        .map_err(|e| format!("{name}: {joined:?} is not a Structured Fields List: {e}"))?;
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => match item.bare_item.as_string() {
                Some(s) => Ok((s.as_str().to_owned(), item.params)),
                None => Err(format!("{name}: an item of {joined:?} is not a String")),
            },
            sfv::ListEntry::InnerList(_) => Err(format!("{name}: an inner list in {joined:?}")),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Parameter `key` of `item` as an Integer of at least `min`.
fn integer(
    params: &sfv::Parameters,
    key: &str,
    item: &str,
    required: bool,
    min: i64,
) -> Result<Option<i64>, String> {
    match params.get(key) {
        None if required => Err(format!("{item:?} has no {key}")),
        None => Ok(None),
        Some(value) => value
            .as_integer()
            .map(i64::from)
            .filter(|n| *n >= min)
            .map(Some)
            .ok_or_else(|| format!("{item:?}: {key} is not an Integer >= {min}")),
    }
}

fn byte_sequence(params: &sfv::Parameters, item: &str) -> Result<(), String> {
    match params.get("pk") {
        Some(value) if value.as_byte_sequence().is_none() => {
            Err(format!("{item:?}: pk is not a Byte Sequence"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_drafts_examples_pass_and_malformed_fields_do_not() {
        let ok = headers(&[
            ("ratelimit-policy", r#""burst";q=100;w=60,"daily";q=1000;w=86400"#),
            ("ratelimit", r#""burst";r=0;t=5, "daily";r=999"#),
            ("retry-after", "5"),
        ]);
        assert_eq!(check(429, &ok, b""), Ok(()));
        for bad in [
            &[("ratelimit-policy", r#"burst;q=100"#)][..],
            &[("ratelimit-policy", r#""a";w=60"#)],
            &[("ratelimit-policy", r#""a";q=-1"#)],
            &[("ratelimit-policy", r#""a";q=1;w=0"#)],
            &[("ratelimit-policy", r#""a";q=1, "a";q=2"#)],
            &[("ratelimit-policy", r#""a";q=1"#), ("ratelimit", r#""b";r=1"#)],
            &[("ratelimit", r#""a";t=1"#)],
            &[("ratelimit", r#""a";r=1;t=1.5"#)],
            &[("ratelimit", r#""a";r=1,"#)],
            &[("ratelimit", r#""a";r=0;t=9"#), ("retry-after", "5")],
        ] {
            assert!(check(429, &headers(bad), b"").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_item_is_read_as_the_parser_decodes_it() {
        let map = headers(&[
            (
                "ratelimit-policy",
                r#""free";q=20;w=60, "free.bytes";q=100;qu="content-bytes""#,
            ),
            ("ratelimit", r#""free";r=19;t=3"#),
        ]);
        assert_eq!(item(&map, "ratelimit", "free").as_deref(), Some("r=19;t=3"));
        assert_eq!(
            item(&map, "ratelimit-policy", "free.bytes").as_deref(),
            Some(r#"q=100;qu="content-bytes""#)
        );
        assert_eq!(item(&map, "ratelimit", "free.bytes"), None);
        assert_eq!(item(&map, "retry-after", "free"), None);
    }

    #[test]
    fn a_quota_exceeded_body_names_policies_of_the_field() {
        let mut map = headers(&[("ratelimit-policy", r#""a";q=1"#), ("retry-after", "3")]);
        map.insert("content-type", "application/problem+json".parse().unwrap());
        let good = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","violated-policies":["a"]}"#;
        let bad = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","violated-policies":["b"]}"#;
        assert_eq!(check(429, &map, good), Ok(()));
        assert!(check(429, &map, bad).is_err());
    }
}

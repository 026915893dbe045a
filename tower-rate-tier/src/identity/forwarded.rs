//! The forwarding headers a proxy writes, read byte-wise from the right.
//!
//! A proxy appends the address it saw to the right of whatever the client
//! sent, so the right-most entries are the only ones a trusted proxy vouches
//! for, and everything to their left may be garbage. The reader therefore
//! never looks at a whole header value: it cuts one comma-separated entry at
//! a time off the right end (several header lines are one list, the last
//! line right-most), parses that entry alone, and ends at the first entry
//! that is not an address. A client's non-UTF-8 bytes or forged hops on the
//! left are never reached while the proxy's own entries are usable.
//!
//! The work is bounded whatever the client sends: at most [`MAX_HOPS`]
//! entries of one header, and an entry longer than its kind allows ends the
//! walk without being scanned further.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{FORWARDED, HeaderMap, HeaderValue, ValueIter};

/// The most entries read from one header.
pub(super) const MAX_HOPS: usize = 20;

/// The longest `X-Forwarded-For` entry read, whitespace included
/// (`[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535` is 53 bytes).
const MAX_XFF_ENTRY: usize = 128;

/// The longest `Forwarded` element read (`for`, `by`, `proto` and a `host`
/// of up to 253 bytes fit).
const MAX_FORWARDED_ELEMENT: usize = 512;

/// A forwarding header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for=proxy1`.
    Forwarded,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::XForwardedFor => "x-forwarded-for",
            Kind::Forwarded => FORWARDED.as_str(),
        }
    }

    fn max_entry(self) -> usize {
        match self {
            Kind::XForwardedFor => MAX_XFF_ENTRY,
            Kind::Forwarded => MAX_FORWARDED_ELEMENT,
        }
    }

    fn parse(self, entry: &[u8]) -> Option<IpAddr> {
        match self {
            Kind::XForwardedFor => node(entry.trim_ascii()),
            Kind::Forwarded => forwarded_for(entry),
        }
    }

    /// Whether the request carries this header at all.
    pub(super) fn is_present(self, headers: &HeaderMap) -> bool {
        headers.contains_key(self.name())
    }
}

/// The addresses of one forwarding header, right-most first. The iterator
/// ends at the first entry that is not an address, and after [`MAX_HOPS`]
/// entries.
pub(super) struct Hops<'a> {
    kind: Kind,
    lines: ValueIter<'a, HeaderValue>,
    /// The part of the current line left of the entries already read;
    /// `None` when the next entry starts a new line.
    rest: Option<&'a [u8]>,
    budget: usize,
}

impl<'a> Hops<'a> {
    pub(super) fn new(headers: &'a HeaderMap, kind: Kind) -> Self {
        Hops {
            kind,
            lines: headers.get_all(kind.name()).iter(),
            rest: None,
            budget: MAX_HOPS,
        }
    }
}

impl Iterator for Hops<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        if self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        let line = match self.rest.take() {
            Some(rest) => rest,
            None => self.lines.next_back()?.as_bytes(),
        };
        // Only the last `max + 1` bytes are searched for the comma that
        // starts the entry: a longer entry is not an address.
        let max = self.kind.max_entry();
        let window = line.len().saturating_sub(max + 1);
        let entry = match line[window..].iter().rposition(|&b| b == b',') {
            Some(comma) => {
                self.rest = Some(&line[..window + comma]);
                &line[window + comma + 1..]
            }
            None if window == 0 => line,
            None => return self.stop(),
        };
        match self.kind.parse(entry) {
            Some(ip) => Some(ip),
            None => self.stop(),
        }
    }
}

impl Hops<'_> {
    fn stop(&mut self) -> Option<IpAddr> {
        self.budget = 0;
        None
    }
}

/// The `for` node of one `Forwarded` element (`for=..;proto=..;by=..`).
/// An element without `for`, with it twice, or with a malformed pair is
/// not an address.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let mut found = None;
    for pair in element.split(|&b| b == b';') {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = (&pair[..eq], &pair[eq + 1..]);
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(value);
        }
    }
    node(unquote(found?)?)
}

/// A token or a quoted string without escapes (no address needs one).
fn unquote(value: &[u8]) -> Option<&[u8]> {
    match value {
        [b'"', inner @ .., b'"'] if !inner.iter().any(|&b| b == b'"' || b == b'\\') => Some(inner),
        _ if value.contains(&b'"') => None,
        _ => Some(value),
    }
}

/// An RFC 7239 node: `198.51.100.7`, `198.51.100.7:4711`, `[2001:db8::7]`,
/// `[2001:db8::7]:4711` (obfuscated ports such as `:_p1` too), or a bare
/// IPv6 address. `unknown` and obfuscated names (`_hidden`) are not
/// addresses.
fn node(node: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(node).ok()?;
    if let Some(bracketed) = text.strip_prefix('[') {
        let (ip, after) = bracketed.split_once(']')?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok.then_some(IpAddr::V6(ip));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (ip, port) = text.rsplit_once(':')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    is_port(port).then_some(IpAddr::V4(ip))
}

/// A port number, or an obfuscated port (`_` and letters, digits, `.`,
/// `_`, `-`).
fn is_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obfuscated) => {
            !obfuscated.is_empty()
                && obfuscated
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => {
            (1..=5).contains(&port.len())
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const NONE: [IpAddr; 0] = [];

    fn hops(kind: Kind, lines: &[&[u8]]) -> Vec<IpAddr> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(kind.name(), HeaderValue::from_bytes(line).unwrap());
        }
        Hops::new(&headers, kind).collect()
    }

    #[test]
    fn nodes_with_ports_brackets_and_obfuscation() {
        assert_eq!(node(b"198.51.100.7"), Some(ip("198.51.100.7")));
        assert_eq!(node(b"198.51.100.7:4711"), Some(ip("198.51.100.7")));
        assert_eq!(node(b"2001:db8::7"), Some(ip("2001:db8::7")));
        assert_eq!(node(b"[2001:db8::7]"), Some(ip("2001:db8::7")));
        assert_eq!(node(b"[2001:db8::7]:4711"), Some(ip("2001:db8::7")));
        assert_eq!(node(b"[2001:db8::7]:_p-1"), Some(ip("2001:db8::7")));
        assert_eq!(node(b"::ffff:1.2.3.4"), Some(ip("::ffff:1.2.3.4")));
        for bad in [
            &b"unknown"[..],
            b"UNKNOWN",
            b"_hidden",
            b"_hidden:80",
            b"",
            b"1.2.3",
            b"1.2.3.4:",
            b"1.2.3.4:65536",
            b"1.2.3.4:+80",
            b"1.2.3.4:_",
            b"[1.2.3.4]",
            b"[2001:db8::7",
            b"[2001:db8::7]80",
            b"[2001:db8::7]:80:80",
            b"fe80::1%eth0",
            b"\xff1.2.3.4",
        ] {
            assert_eq!(node(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn forwarded_elements() {
        let p = |e: &[u8]| forwarded_for(e);
        assert_eq!(p(b"for=198.51.100.7"), Some(ip("198.51.100.7")));
        assert_eq!(p(b" For=198.51.100.7 ;proto=https"), Some(ip("198.51.100.7")));
        assert_eq!(
            p(b"proto=http;FOR=\"[2001:db8::1]:4711\";by=_p"),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(p(b"for=\"198.51.100.7:80\";"), Some(ip("198.51.100.7")));
        for bad in [
            &b"proto=https"[..],
            b"for=unknown",
            b"for=_hidden",
            b"for=\"_hidden\"",
            b"for=1.2.3.4;for=5.6.7.8",
            b"for",
            b"for=\"1.2.3.4",
            b"for=1.2.3.4\"",
            b"for=\"1.2\\.3.4\"",
            b"for=[2001:db8::1]:80\xff",
            b"by=1.2.3.4",
        ] {
            assert_eq!(p(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn x_forwarded_for_is_cut_from_the_right_past_garbage_on_the_left() {
        let xff = |lines: &[&[u8]]| hops(Kind::XForwardedFor, lines);
        assert_eq!(xff(&[b"\xff, 203.0.113.1"]), [ip("203.0.113.1")]);
        assert_eq!(
            xff(&[b"\xff\xfe,,1.1.1.1 ,\t2.2.2.2 , [2001:db8::1]:80"]),
            [ip("2001:db8::1"), ip("2.2.2.2"), ip("1.1.1.1")]
        );
        // lines are one list, the last line right-most
        assert_eq!(
            xff(&[b"1.1.1.1", b"garbage, 2.2.2.2, 3.3.3.3", b"4.4.4.4"]),
            [ip("4.4.4.4"), ip("3.3.3.3"), ip("2.2.2.2")]
        );
        // an empty entry or line is not an address
        assert_eq!(xff(&[b"1.1.1.1, "]), NONE);
        assert_eq!(xff(&[b"1.1.1.1", b""]), NONE);
        assert_eq!(xff(&[]), NONE);
    }

    #[test]
    fn forwarded_elements_are_read_from_the_right() {
        let fwd = |lines: &[&[u8]]| hops(Kind::Forwarded, lines);
        assert_eq!(
            fwd(&[
                b"for=\xff",
                b"for=1.1.1.1, for=\"[2001:db8::1]:4711\";proto=https"
            ]),
            [ip("2001:db8::1"), ip("1.1.1.1")]
        );
        assert_eq!(fwd(&[b"for=1.1.1.1, for=_hidden, for=2.2.2.2"]), [ip("2.2.2.2")]);
        assert_eq!(fwd(&[b"for=1.1.1.1, for=unknown"]), NONE);
    }

    #[test]
    fn the_work_is_bounded() {
        // many entries: only MAX_HOPS are read
        let many = "9.9.9.9, ".repeat(10_000) + "1.1.1.1";
        assert_eq!(hops(Kind::XForwardedFor, &[many.as_bytes()]).len(), MAX_HOPS);
        let lines: Vec<&[u8]> = vec![b"9.9.9.9"; 1000];
        assert_eq!(hops(Kind::XForwardedFor, &lines).len(), MAX_HOPS);
        // a 64 KiB entry ends the walk; the entries right of it are read
        let long = "1".repeat(64 * 1024) + ", 2.2.2.2";
        assert_eq!(hops(Kind::XForwardedFor, &[long.as_bytes()]), [ip("2.2.2.2")]);
        let long = format!("{}1.1.1.1", " ".repeat(MAX_XFF_ENTRY));
        assert_eq!(hops(Kind::XForwardedFor, &[long.as_bytes()]), NONE);
        let fits = format!("{}1.1.1.1", " ".repeat(MAX_XFF_ENTRY - 7));
        assert_eq!(hops(Kind::XForwardedFor, &[fits.as_bytes()]), [ip("1.1.1.1")]);
        let element = format!("for=1.1.1.1;host={}", "h".repeat(MAX_FORWARDED_ELEMENT));
        assert_eq!(hops(Kind::Forwarded, &[element.as_bytes()]), NONE);
    }
}

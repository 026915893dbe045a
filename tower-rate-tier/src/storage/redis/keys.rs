//! Key names: which Redis key holds which band of which bucket.
//!
//! A band's key is `{prefix}:{<hash>}:<band>`:
//!
//! * `<hash>` is the first 128 bits (hex) of SHA-256, or of HMAC-SHA-256
//!   under the storage's secret, over the unambiguous encoding
//!   `[len][namespace][len][tier][user]` (lengths as little-endian `u64`).
//!   The braces make it the Redis Cluster hash tag: every band of one bucket
//!   lives in one slot, so one script call can decide them all.
//! * `<band>` names the band by its refill window, never its position in
//!   the tier: the [`BandName`] every storage uses, `w<milliseconds>`
//!   (`w3600000` for an hourly band), with `.1`, `.2` for further bands of
//!   one tier with the same window. An unlimited band (never stored) is
//!   `unlimited`. Adding, removing or reordering a tier's bands leaves the
//!   other bands' state where it was, and a band whose window stays (a
//!   raise from `per_hour(100)` to `per_hour(200)`) keeps its state.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::super::{BandName, StorageError, StorageErrorKind, StorageKey, band_names};
use crate::quota::Quota;

/// One key name (inline up to a long prefix and a nanosecond window).
pub(super) type KeyBuf = SmallVec<[u8; 80]>;

/// Turns a [`StorageKey`] into key names.
pub(super) struct KeyCodec {
    pub(super) prefix: Box<str>,
    secret: Option<Hmac<Sha256>>,
}

impl KeyCodec {
    /// Refuses a prefix with braces (Redis Cluster would take a brace pair in
    /// it as every key's hash tag: all users in one slot) and an empty
    /// secret (it would hide nothing, behind a setting that says it does).
    pub(super) fn new(prefix: &str, secret: Option<&[u8]>) -> Result<Self, StorageError> {
        let refuse = |message: &'static str| StorageError::new(StorageErrorKind::Other, message);
        if prefix.contains(['{', '}']) {
            return Err(refuse("the Redis key prefix must not contain `{` or `}`"));
        }
        let secret = match secret {
            None => None,
            Some([]) => {
                return Err(refuse(
                    "the Redis hash secret is empty: give a secret of at least 32 random bytes, \
                     or leave `hash_secret` unset",
                ));
            }
            Some(bytes) => Some(
                <Hmac<Sha256> as KeyInit>::new_from_slice(bytes)
                    .map_err(|_| refuse("the Redis hash secret was refused"))?,
            ),
        };
        Ok(KeyCodec {
            prefix: prefix.into(),
            secret,
        })
    }

    /// Whether user ids are hashed under a secret.
    pub(super) fn has_secret(&self) -> bool {
        self.secret.is_some()
    }

    /// `{prefix}:{<hash>}:` (a band's name follows).
    pub(super) fn base_key(&self, key: StorageKey<'_>) -> KeyBuf {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest: [u8; 32] = match &self.secret {
            Some(mac) => {
                let mut mac = mac.clone();
                feed(|part| mac.update(part), key);
                mac.finalize().into_bytes().into()
            }
            None => {
                let mut hasher = Sha256::new();
                feed(|part| hasher.update(part), key);
                hasher.finalize().into()
            }
        };
        let mut out = KeyBuf::new();
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(b":{");
        for byte in &digest[..16] {
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        }
        out.extend_from_slice(b"}:");
        out
    }

    /// The key of one band of `key`.
    pub(super) fn band_key(&self, key: StorageKey<'_>, quota: &Quota) -> KeyBuf {
        let mut out = self.base_key(key);
        if let Some(name) = band_names(std::slice::from_ref(quota)).next() {
            push_band(&mut out, quota, name);
        }
        out
    }
}

/// Feeds the unambiguous encoding `[len][namespace][len][tier][user]`.
pub(super) fn feed(mut update: impl FnMut(&[u8]), key: StorageKey<'_>) {
    update(&(key.namespace.len() as u64).to_le_bytes());
    update(key.namespace.as_bytes());
    update(&(key.tier.len() as u64).to_le_bytes());
    update(key.tier.as_bytes());
    update(key.user.as_bytes());
}

/// Appends a band's name: `w<milliseconds>` (and `.<repeat>`), or
/// `unlimited`; a unit's band starts with the unit's name
/// (`tokens.w60000`).
pub(super) fn push_band(key: &mut KeyBuf, quota: &Quota, name: BandName) {
    if quota.is_unlimited() {
        key.extend_from_slice(b"unlimited");
        return;
    }
    let unit = quota.unit();
    if !unit.is_requests() {
        key.extend_from_slice(unit.as_str().as_bytes());
        key.push(b'.');
    }
    let mut digits = itoa::Buffer::new();
    key.push(b'w');
    key.extend_from_slice(digits.format(name.window_ms).as_bytes());
    if name.repeat > 0 {
        key.push(b'.');
        key.extend_from_slice(digits.format(name.repeat).as_bytes());
    }
}

/// The Redis Cluster hash slot of a key this codec made: CRC16 (XMODEM)
/// of its hash tag, the text between its first `{` and the `}` after it
/// (the whole key when there is none, as Redis does), modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(key) {
        crc = (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ byte)];
    }
    crc & 0x3fff
}

/// CRC16-XMODEM (polynomial 0x1021) by byte, as Redis Cluster uses it.
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Appends `b<index>`: band names by position, which this storage no longer
/// reads or writes (see `RedisStorage::key_for`).
pub(super) fn push_index(key: &mut KeyBuf, band: usize) {
    key.push(b'b');
    key.extend_from_slice(itoa::Buffer::new().format(band).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(codec: &KeyCodec, namespace: &str, tier: &str, user: &str, band: &Quota) -> String {
        let k = codec.band_key(
            StorageKey {
                namespace,
                tier,
                user,
            },
            band,
        );
        String::from_utf8(k.to_vec()).unwrap()
    }

    fn band_name(quota: &Quota) -> String {
        let mut k = KeyBuf::new();
        let name = band_names(std::slice::from_ref(quota)).next().unwrap();
        push_band(&mut k, quota, name);
        String::from_utf8(k.to_vec()).unwrap()
    }

    #[test]
    fn keys_share_a_hash_tag_and_hide_the_user() {
        let codec = KeyCodec::new("trt", None).unwrap();
        let hour = key(&codec, "", "free", "alice@example.com", &Quota::per_hour(100));
        let day = key(&codec, "", "free", "alice@example.com", &Quota::per_day(1_000));
        assert!(
            hour.starts_with("trt:{") && hour.ends_with("}:w3600000"),
            "{hour}"
        );
        assert_eq!(hour.len(), "trt:{".len() + 32 + "}:w3600000".len());
        assert!(day.ends_with("}:w86400000"), "{day}");
        assert!(!hour.contains("alice") && !hour.contains("free"));
        // the Cluster hash tag is the part between the first `{` and `}`
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        assert_eq!(tag(&hour), tag(&day));
    }

    #[test]
    fn a_band_is_named_by_its_window_not_its_position() {
        assert_eq!(band_name(&Quota::per_minute(10)), "w60000");
        assert_eq!(band_name(&Quota::per_second(1_000).with_burst(3)), "w3");
        assert_eq!(band_name(&Quota::per_second(3)), "w1000");
        assert_eq!(band_name(&Quota::unlimited()), "unlimited");
        // a raise that keeps the period keeps the key
        assert_eq!(band_name(&Quota::per_hour(100)), band_name(&Quota::per_hour(200)));
        // two bands of one tier with one window get distinct keys
        let bands = [
            Quota::per_minute(10).with_burst(20),
            Quota::per_hour(60).with_burst(2),
        ];
        let names: Vec<String> = bands
            .iter()
            .zip(band_names(&bands))
            .map(|(q, n)| {
                let mut k = KeyBuf::new();
                push_band(&mut k, q, n);
                String::from_utf8(k.to_vec()).unwrap()
            })
            .collect();
        assert_eq!(names, ["w120000", "w120000.1"]);
    }

    #[test]
    fn distinct_keys_never_collide_across_separators() {
        let codec = KeyCodec::new("trt", None).unwrap();
        let q = Quota::per_second(1);
        let a = key(&codec, "", "a:b", "c", &q);
        let b = key(&codec, "", "a", "b:c", &q);
        let c = key(&codec, "a", "b", "c", &q);
        let d = key(&codec, "", "ab", "c", &q);
        assert!(a != b && a != c && a != d && b != c && b != d && c != d);
    }

    #[test]
    fn a_secret_changes_every_key() {
        let plain = KeyCodec::new("trt", None).unwrap();
        let one = KeyCodec::new("trt", Some(b"one")).unwrap();
        let one_again = KeyCodec::new("trt", Some(b"one")).unwrap();
        let two = KeyCodec::new("trt", Some(b"two")).unwrap();
        assert!(one.has_secret() && !plain.has_secret());
        let k = |c: &KeyCodec| key(c, "", "free", "203.0.113.7", &Quota::per_minute(10));
        assert_eq!(k(&one), k(&one_again));
        assert_ne!(k(&one), k(&plain));
        assert_ne!(k(&one), k(&two));
        // the plain hash is SHA-256 of the documented encoding
        let mut h = Sha256::new();
        feed(
            |p| h.update(p),
            StorageKey {
                namespace: "",
                tier: "free",
                user: "203.0.113.7",
            },
        );
        let digest: [u8; 32] = h.finalize().into();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(k(&plain), format!("trt:{{{hex}}}:w60000"));
    }

    #[test]
    fn a_prefix_with_braces_and_an_empty_secret_are_refused() {
        assert!(KeyCodec::new("app{x}", None).is_err());
        assert!(KeyCodec::new("app:v2", None).is_ok());
        let err = KeyCodec::new("app", Some(b"")).err().unwrap();
        assert!(err.to_string().contains("hash secret is empty"), "{err}");
    }

    #[test]
    fn slots_are_redis_cluster_hash_slots() {
        // `CLUSTER KEYSLOT` of each, and the CRC16-XMODEM check value
        assert_eq!(slot(b"a"), 15495);
        assert_eq!(slot(b"b"), 3300);
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"x{a}y"), 15495);
        // an empty tag is no tag: the whole key
        assert_eq!(slot(b"{}a"), 10875);
        let codec = KeyCodec::new("t", None).unwrap();
        let k = StorageKey {
            namespace: "",
            tier: "free",
            user: "u",
        };
        let base = codec.base_key(k);
        assert_eq!(slot(&base), slot(&codec.band_key(k, &Quota::per_day(3))));
        assert_eq!(
            slot(&base),
            slot(&base[base.iter().position(|&b| b == b'{').unwrap() + 1..base.len() - 2])
        );
    }

    #[test]
    fn index_suffixes() {
        for (band, text) in [(0, "b0"), (7, "b7"), (10, "b10"), (123, "b123")] {
            let mut k = KeyBuf::new();
            push_index(&mut k, band);
            assert_eq!(&k[..], text.as_bytes());
        }
    }
}

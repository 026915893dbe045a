//! [`UserId`]: a user id checked once, where it enters the limiter, and
//! [`User`], the owned one a request's bill and charge keep.

use super::MAX_USER_ID_LEN;

/// A user id of 1 to [`MAX_USER_ID_LEN`] bytes: checked when it is made, so
/// that nothing downstream checks it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UserId<'a>(&'a str);

impl<'a> UserId<'a> {
    /// `id`, when it is a user id the limiter counts.
    #[inline]
    pub(crate) fn new(id: &'a str) -> Option<Self> {
        (!id.is_empty() && id.len() <= MAX_USER_ID_LEN).then_some(UserId(id))
    }

    /// The id.
    #[inline]
    pub(crate) fn as_str(self) -> &'a str {
        self.0
    }
}

/// An owned [`UserId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User(String);

impl User {
    /// `id`, when it is a user id the limiter counts.
    pub(crate) fn new(id: String) -> Option<Self> {
        UserId::new(&id)?;
        Some(User(id))
    }

    /// The checked id.
    #[inline]
    pub(crate) fn id(&self) -> UserId<'_> {
        UserId(&self.0)
    }

    /// The id as text (for logs' pseudonyms).
    #[inline]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_to_max_bytes() {
        assert!(UserId::new("").is_none());
        assert!(UserId::new(&"a".repeat(MAX_USER_ID_LEN + 1)).is_none());
        assert_eq!(UserId::new("ada").map(UserId::as_str), Some("ada"));
        let long = "a".repeat(MAX_USER_ID_LEN);
        assert_eq!(
            User::new(long.clone()).map(|u| u.as_str().len()),
            Some(long.len())
        );
        assert!(User::new(String::new()).is_none());
    }
}

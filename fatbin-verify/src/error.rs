//! The one error type of the library. Every variant names the byte offset it is about and what
//! was expected there, so a report on a corrupt file points at the bytes to look at.

/// Something in the input is not what the format requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The input has no bytes at all.
    #[error("input is empty: expected a fatbin, cubin, PTX file, ELF host binary or ar archive")]
    Empty,

    /// A structure runs past the end of the buffer.
    #[error("{what} at {offset:#x}: needs {needed:#x} bytes but only {available:#x} remain in the input")]
    Truncated {
        what: &'static str,
        offset: usize,
        needed: u64,
        available: usize,
    },

    /// A field holds a value the format does not allow.
    #[error("{what} at {offset:#x}: {detail}")]
    Malformed {
        what: &'static str,
        offset: usize,
        detail: String,
    },

    /// A compressed payload would decompress to more than the caller allows.
    #[error("{what} at {offset:#x}: payload would decompress to {size:#x} bytes, over the limit of {limit:#x} bytes (raise Limits::max_decompressed_total if the input is trusted)")]
    TooLarge {
        what: &'static str,
        offset: usize,
        size: u64,
        limit: u64,
    },

    /// The compressed payload itself is corrupt.
    #[error("{what} at {offset:#x}: {codec} payload does not decompress: {detail}")]
    Decompress {
        what: &'static str,
        offset: usize,
        codec: &'static str,
        detail: String,
    },

    /// Nothing in the input looks like any format this library reads.
    #[error("input of {len} bytes is not a fatbin, cubin, PTX file, ELF host binary or ar archive (it starts with {head})")]
    UnknownFormat { len: usize, head: String },

    /// An `ImageInfo` passed back in does not describe an image of this buffer.
    #[error("image {source_desc}: {detail}")]
    ImageNotFound { source_desc: String, detail: String },
}

impl Error {
    pub(crate) fn malformed(what: &'static str, offset: usize, detail: impl Into<String>) -> Self {
        Error::Malformed {
            what,
            offset,
            detail: detail.into(),
        }
    }
}

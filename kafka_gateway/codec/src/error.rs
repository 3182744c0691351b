//! Errors of the codec, each carrying the Kafka error name the broker answers with.

use std::fmt;

/// The Kafka error a malformed or refused record batch maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    CorruptMessage,
    InvalidRecord,
    UnsupportedCompressionType,
    UnsupportedForMessageFormat,
    RecordListTooLarge,
    MessageTooLarge,
}

impl Code {
    /// Kafka's name for the error (`org.apache.kafka.common.protocol.Errors`).
    pub fn name(self) -> &'static str {
        match self {
            Code::CorruptMessage => "CORRUPT_MESSAGE",
            Code::InvalidRecord => "INVALID_RECORD",
            Code::UnsupportedCompressionType => "UNSUPPORTED_COMPRESSION_TYPE",
            Code::UnsupportedForMessageFormat => "UNSUPPORTED_FOR_MESSAGE_FORMAT",
            Code::RecordListTooLarge => "RECORD_LIST_TOO_LARGE",
            Code::MessageTooLarge => "MESSAGE_TOO_LARGE",
        }
    }
}

/// A refused input: the Kafka error code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    pub code: Code,
    pub message: String,
}

impl CodecError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        CodecError {
            code,
            message: message.into(),
        }
    }

    /// Prefixes the message with where the error happened (batch and record index).
    pub fn context(mut self, prefix: impl fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

pub type Result<T> = std::result::Result<T, CodecError>;

pub fn corrupt(message: impl Into<String>) -> CodecError {
    CodecError::new(Code::CorruptMessage, message)
}

pub fn invalid(message: impl Into<String>) -> CodecError {
    CodecError::new(Code::InvalidRecord, message)
}

pub fn too_large(message: impl Into<String>) -> CodecError {
    CodecError::new(Code::MessageTooLarge, message)
}

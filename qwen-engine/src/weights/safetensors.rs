//! Loading a Hugging Face model folder (to be written).

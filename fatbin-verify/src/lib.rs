//! Parse and verify NVIDIA GPU code containers: fatbins, cubins, PTX and host binaries that embed them.
//!
//! Every parser works over `&[u8]`, never copies what it need not, and treats every byte as hostile:
//! each offset and size is checked before it is read, and errors name the offset and what was
//! expected there. Byte layouts: `docs/fatbin-format.md`.
//!
//! The same library serves the build script (reading back what nvcc made), the runtime dispatcher
//! (image kinds and PTX versions) and the `fatbin-verify` CLI (list, extract, verify).

pub mod cubin;
mod decompress;
mod elf;
pub mod error;
pub mod fatbin;
pub mod host;
pub mod image;
pub mod lock;
pub mod manifest;
pub mod ptx;
mod read;
pub mod target;
pub mod toolkit;
pub mod verify;

pub use decompress::Limits;
pub use error::Error;
pub use fatbin::{Compression, ImageKind};
pub use image::{
    describe_source, image_bytes, image_bytes_with_limits, list_images, list_images_with_limits,
    sha256_hex, ImageInfo, ImageSource,
};
pub use target::{Target, Variant};
pub use toolkit::CudaRelease;

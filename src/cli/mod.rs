//! Commands that prepare what joins the mesh, as istioctl's do: `meshfed vm bootstrap`
//! ([`vm`], the files a VM's agent needs; [`vm_files`] computes them) and `meshfed
//! create-remote-secret` ([`remote_secret`], the Secret a remote cluster is read with);
//! `meshfed analyze` ([`analyze`], Istio's config analyzers, as `istioctl analyze`).

pub mod analyze;
pub mod remote_secret;
pub mod vm;
pub mod vm_files;

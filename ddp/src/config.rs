//! Parameters and options.

use ringccl_collectives::DType;

/// One parameter as DDP sees it: its name (for error messages and the cross-rank check),
/// its number of elements and its element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParamSpec {
    /// A name unique within the model, e.g. `"layer1.weight"`.
    pub name: String,
    /// Number of elements.
    pub numel: usize,
    /// Element type of its gradient.
    pub dtype: DType,
}

impl ParamSpec {
    /// A parameter named `name` with `numel` elements of `dtype`.
    ///
    /// ```
    /// use ringccl::DType;
    /// let p = ringccl::ddp::ParamSpec::new("fc1.weight", 512 * 256, DType::F32);
    /// assert_eq!((p.name.as_str(), p.numel), ("fc1.weight", 131072));
    /// ```
    pub fn new(name: impl Into<String>, numel: usize, dtype: DType) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            numel,
            dtype,
        }
    }
}

/// DDP's options; the defaults are PyTorch's.
#[derive(Clone, Debug)]
pub struct DdpConfig {
    pub(crate) bucket_cap_bytes: usize,
    pub(crate) first_bucket_bytes: usize,
    pub(crate) find_unused_parameters: bool,
    pub(crate) gradient_as_bucket_view: bool,
    pub(crate) rebuild_buckets: bool,
}

impl Default for DdpConfig {
    fn default() -> DdpConfig {
        DdpConfig {
            bucket_cap_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            find_unused_parameters: false,
            gradient_as_bucket_view: false,
            rebuild_buckets: true,
        }
    }
}

impl DdpConfig {
    /// The default configuration.
    ///
    /// ```
    /// let config = ringccl::ddp::DdpConfig::new(); // torch's defaults
    /// assert_eq!(config.bucket_cap(), 25 << 20);
    /// assert!(!config.gradient_as_bucket_view_on());
    /// ```
    pub fn new() -> DdpConfig {
        DdpConfig::default()
    }

    /// The cap of every bucket but the first (default 25 MiB, torch's `bucket_cap_mb`).
    ///
    /// ```
    /// let config = ringccl::ddp::DdpConfig::new().bucket_cap_bytes(4 << 20);
    /// assert_eq!(config.bucket_cap(), 4 << 20);
    /// ```
    pub fn bucket_cap_bytes(mut self, bytes: usize) -> DdpConfig {
        self.bucket_cap_bytes = bytes;
        self
    }

    /// The cap of the first bucket (default 1 MiB): small, so that the first all-reduce
    /// starts early in the backward pass.
    ///
    /// ```
    /// use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// // Four parameters of 256 bytes; backward produces the last one first.
    /// let params: Vec<ParamSpec> =
    ///     (0..4).map(|i| ParamSpec::new(format!("p{i}"), 64, ringccl::DType::F32)).collect();
    /// let config = DdpConfig::new().first_bucket_bytes(256);
    /// let layout = Reducer::new(0, &params, config).bucket_layout();
    /// assert_eq!(layout, vec![vec![3], vec![2, 1, 0]]); // a first bucket of 256 bytes
    /// ```
    pub fn first_bucket_bytes(mut self, bytes: usize) -> DdpConfig {
        self.first_bucket_bytes = bytes;
        self
    }

    /// Allow steps in which some parameters get no gradient (default false). Their
    /// gradient counts as zero on this rank; `finish` then launches their buckets itself.
    /// Without it, such a step is an error that lists the parameters.
    ///
    /// ```
    /// use ringccl::ddp::{DdpConfig, DistributedDataParallel};
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::new().find_unused_parameters(true);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1), ("head", 1)], config)?;
    /// ddp.mark_grad_ready(0, &[1.0])?; // "head" got no gradient this step
    /// ddp.finish()?; // without find_unused_parameters: an error naming "head"
    /// assert_eq!(ddp.grad(1)?, [0.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn find_unused_parameters(mut self, on: bool) -> DdpConfig {
        self.find_unused_parameters = on;
        self
    }

    /// Gradients live in the buckets (default false): the trainer writes each gradient
    /// into [`grad_view_mut`](crate::DistributedDataParallel::grad_view_mut) and marks it
    /// with [`mark_grad_ready_in_view`](crate::DistributedDataParallel::mark_grad_ready_in_view);
    /// no copy is made and the division by world size happens once per bucket, just
    /// before its all-reduce.
    ///
    /// ```
    /// use ringccl::ddp::{DdpConfig, DistributedDataParallel};
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::new().gradient_as_bucket_view(true);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2)], config)?;
    /// ddp.grad_view_mut(0)?.copy_from_slice(&[1.0, 2.0]); // backward writes in the bucket
    /// ddp.mark_grad_ready_in_view(0)?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, [1.0, 2.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn gradient_as_bucket_view(mut self, on: bool) -> DdpConfig {
        self.gradient_as_bucket_view = on;
        self
    }

    /// Rebuild the buckets once, after the first step, from the order gradients really
    /// arrived on rank 0 (default true, as torch).
    ///
    /// ```
    /// use ringccl::ddp::{DdpConfig, DistributedDataParallel};
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::new().rebuild_buckets(false);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("a", 1), ("b", 1)], config)?;
    /// ddp.mark_grad_ready(0, &[1.0])?; // gradients arrive in registration order
    /// ddp.mark_grad_ready(1, &[1.0])?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.bucket_order(), [1, 0]); // still the first guess: reverse registration
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn rebuild_buckets(mut self, on: bool) -> DdpConfig {
        self.rebuild_buckets = on;
        self
    }

    /// Whether gradients live in the buckets (see
    /// [`gradient_as_bucket_view`](Self::gradient_as_bucket_view)).
    ///
    /// ```
    /// assert!(!ringccl::ddp::DdpConfig::new().gradient_as_bucket_view_on());
    /// ```
    pub fn gradient_as_bucket_view_on(&self) -> bool {
        self.gradient_as_bucket_view
    }

    /// The cap of every bucket but the first, in bytes.
    ///
    /// ```
    /// assert_eq!(ringccl::ddp::DdpConfig::new().bucket_cap(), 25 << 20);
    /// ```
    pub fn bucket_cap(&self) -> usize {
        self.bucket_cap_bytes
    }
}

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
    /// use ringccl_collectives::DType;
    /// let p = ringccl_ddp::ParamSpec::new("fc1.weight", 512 * 256, DType::F32);
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
    /// let config = ringccl_ddp::DdpConfig::new();
    /// assert_eq!(format!("{config:?}"), format!("{:?}", ringccl_ddp::DdpConfig::default()));
    /// ```
    pub fn new() -> DdpConfig {
        DdpConfig::default()
    }

    /// The cap of every bucket but the first (default 25 MiB, torch's `bucket_cap_mb`).
    ///
    /// ```
    /// let config = ringccl_ddp::DdpConfig::new().bucket_cap_bytes(4 << 20);
    /// assert!(format!("{config:?}").contains("bucket_cap_bytes: 4194304"));
    /// ```
    pub fn bucket_cap_bytes(mut self, bytes: usize) -> DdpConfig {
        self.bucket_cap_bytes = bytes;
        self
    }

    /// The cap of the first bucket (default 1 MiB): small, so that the first all-reduce
    /// starts early in the backward pass.
    ///
    /// ```
    /// let config = ringccl_ddp::DdpConfig::new().first_bucket_bytes(256 << 10);
    /// assert!(format!("{config:?}").contains("first_bucket_bytes: 262144"));
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
    /// let config = ringccl_ddp::DdpConfig::new().find_unused_parameters(true);
    /// assert!(format!("{config:?}").contains("find_unused_parameters: true"));
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
    /// let config = ringccl_ddp::DdpConfig::new().gradient_as_bucket_view(true);
    /// assert!(format!("{config:?}").contains("gradient_as_bucket_view: true"));
    /// ```
    pub fn gradient_as_bucket_view(mut self, on: bool) -> DdpConfig {
        self.gradient_as_bucket_view = on;
        self
    }

    /// Rebuild the buckets once, after the first step, from the order gradients really
    /// arrived on rank 0 (default true, as torch).
    ///
    /// ```
    /// let config = ringccl_ddp::DdpConfig::new().rebuild_buckets(false);
    /// assert!(format!("{config:?}").contains("rebuild_buckets: false"));
    /// ```
    pub fn rebuild_buckets(mut self, on: bool) -> DdpConfig {
        self.rebuild_buckets = on;
        self
    }

    /// Whether gradients live in the buckets (see
    /// [`gradient_as_bucket_view`](Self::gradient_as_bucket_view)).
    ///
    /// ```
    /// assert!(!ringccl_ddp::DdpConfig::new().gradient_as_bucket_view_on());
    /// ```
    pub fn gradient_as_bucket_view_on(&self) -> bool {
        self.gradient_as_bucket_view
    }

    /// The cap of every bucket but the first, in bytes.
    ///
    /// ```
    /// assert_eq!(ringccl_ddp::DdpConfig::new().bucket_cap(), 25 << 20);
    /// ```
    pub fn bucket_cap(&self) -> usize {
        self.bucket_cap_bytes
    }
}

//! `meshfed analyze`: Istio's config analyzers over files, directories or a cluster,
//! printed as `istioctl analyze` prints them.
//!
//! The analyzers are `meshfed_registry::analysis` (shared with the server). Inputs:
//! files and directories given as arguments (multi-document YAML or JSON; directories
//! walked recursively like `--configDir`), or, with no file or with `--kubeconfig` /
//! `--context`, the cluster (the config kinds meshfed reads, Services, Pods and
//! Namespaces). Output: one line per message (`Error [IST0101] (VirtualService
//! default/reviews f.yaml:3) Referenced host not found: "reviews2"`), or `-o json` /
//! `-o yaml`; exit code 79 (istioctl's) when a message reaches `--failure-threshold`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use meshfed_registry::analysis::{self, InputBuilder, Level, Message, read};

/// istioctl's exit code when analyzers found issues at or above the failure
/// threshold.
pub const ISSUES_EXIT_CODE: u8 = 79;

/// `meshfed analyze [FILE|DIR...]`.
#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Files or directories (recursive) to analyze; none: the cluster.
    pub files: Vec<PathBuf>,
    /// Accepted for istioctl compatibility: directories are always walked recursively.
    #[arg(short = 'R', long = "recursive")]
    pub recursive: bool,
    /// Kubeconfig of the cluster to analyze (default: KUBECONFIG, ~/.kube/config).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long = "context")]
    pub context: Option<String>,
    /// Read the cluster even when files are given (the files are added to it).
    #[arg(long = "use-kube")]
    pub use_kube: bool,
    /// The namespace analyzed, and the namespace of file objects that name none.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    /// Analyze every namespace of the cluster.
    #[arg(short = 'A', long = "all-namespaces")]
    pub all_namespaces: bool,
    /// The mesh's root namespace.
    #[arg(short = 'i', long = "istioNamespace", default_value = "istio-system")]
    pub istio_namespace: String,
    /// Output format: log, json or yaml.
    #[arg(short = 'o', long = "output", default_value = "log")]
    pub output: String,
    /// The lowest level that makes the exit code non-zero (Info, Warning, Error).
    #[arg(long = "failure-threshold", default_value = "Error")]
    pub failure_threshold: String,
    /// The lowest level printed (Info, Warning, Error).
    #[arg(long = "output-threshold", default_value = "Info")]
    pub output_threshold: String,
}

/// What a run found: the messages to print and whether one reaches the failure
/// threshold.
#[derive(Debug)]
pub struct Outcome {
    pub messages: Vec<Message>,
    pub failed: bool,
    /// `namespace: default` or `all namespaces`, for the summary line.
    pub target: String,
}

fn level(flag: &str, text: &str) -> anyhow::Result<Level> {
    Level::parse(text).with_context(|| format!("{flag} {text:?}: use Info, Warning or Error"))
}

/// Runs the analyzers over the documents; messages below the output threshold and,
/// unless `--all-namespaces`, about other namespaces' objects read from a cluster are
/// left out.
pub fn analyze_documents(
    args: &AnalyzeArgs,
    documents: Vec<read::Document>,
    from_cluster: bool,
) -> anyhow::Result<Outcome> {
    let failure = level("--failure-threshold", &args.failure_threshold)?;
    let shown = level("--output-threshold", &args.output_threshold)?;
    let mut builder = InputBuilder::new(&args.namespace).root_namespace(&args.istio_namespace);
    for doc in documents {
        builder.add(doc);
    }
    let inputs = builder.finish();
    let messages: Vec<Message> = analysis::analyze(&inputs)
        .into_iter()
        .filter(|m| m.level >= shown)
        .filter(|m| {
            args.all_namespaces
                || !from_cluster
                || m.object.namespace.is_empty()
                || m.object.namespace == args.namespace
        })
        .collect();
    let failed = messages.iter().any(|m| m.level >= failure);
    let target = if args.all_namespaces {
        "all namespaces".to_string()
    } else {
        format!("namespace: {}", args.namespace)
    };
    Ok(Outcome {
        messages,
        failed,
        target,
    })
}

/// A message as istioctl's `-o json|yaml` writes it.
fn structured(m: &Message) -> serde_json::Value {
    let mut v = serde_json::json!({
        "code": m.code,
        "level": m.level.as_str(),
        "origin": m.object.friendly_name(),
        "message": m.text,
        "documentationUrl": m.documentation_url,
    });
    if !m.object.source.is_empty() {
        v["reference"] = m.object.source.clone().into();
    }
    v
}

/// Renders the outcome: the text for stdout and the summary for stderr.
pub fn render(outcome: &Outcome, output: &str) -> anyhow::Result<(String, String)> {
    let list: Vec<serde_json::Value> = outcome.messages.iter().map(structured).collect();
    let out = match output {
        "log" => outcome.messages.iter().map(|m| format!("{m}\n")).collect(),
        "json" => serde_json::to_string_pretty(&list)? + "\n",
        "yaml" => serde_norway::to_string(&list)?,
        other => anyhow::bail!("-o {other:?}: use log, json or yaml"),
    };
    let summary = if outcome.messages.is_empty() {
        format!(
            "\u{2714} No validation issues found when analyzing {}.\n",
            outcome.target
        )
    } else if outcome.failed {
        format!(
            "Error: Analyzers found issues when analyzing {}.\nSee {} for more information about causes and resolutions.\n",
            outcome.target,
            analysis::DOC_PREFIX
        )
    } else {
        String::new()
    };
    Ok((out, summary))
}

/// `meshfed analyze`.
pub fn run(args: AnalyzeArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut documents =
        read::read_paths(&args.files).map_err(|e| anyhow::anyhow!("reading the files: {e}"))?;
    let from_cluster = args.files.is_empty()
        || args.use_kube
        || args.kubeconfig.is_some()
        || args.context.is_some();
    if from_cluster {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let namespace = (!args.all_namespaces).then_some(args.namespace.as_str());
        let (values, warnings) = runtime.block_on(async {
            let (client, _) = meshfed_kube::cli_client::cli_client(
                args.kubeconfig.as_deref(),
                args.context.as_deref(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("Kubernetes API: {e}"))?;
            meshfed_kube::cli_client::list_for_analysis(&client, namespace)
                .await
                .map_err(|e| anyhow::anyhow!("Kubernetes API: {e}"))
        })?;
        for w in warnings {
            eprintln!("warn: {w}");
        }
        documents.extend(values.into_iter().map(|value| read::Document {
            value,
            source: String::new(),
        }));
    }
    let outcome = analyze_documents(&args, documents, from_cluster)?;
    let (out, summary) = render(&outcome, &args.output)?;
    print!("{out}");
    eprint!("{summary}");
    Ok(if outcome.failed {
        std::process::ExitCode::from(ISSUES_EXIT_CODE)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

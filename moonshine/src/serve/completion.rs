//! `POST /v1/chat/completions`, `/v1/completions`, `/infill`, as named steps: parse, admit,
//! tokenize, generate (on the blocking pool), answer whole or as server-sent events.

use super::*;

/// What the generation thread reports once the prompt is in the cache.
pub(super) struct Started {
    /// Whether the answer streams (the handler answers the event stream at once).
    pub(super) stream: bool,
    pub(super) timing: Timing,
}

/// The `param` a route's prompt problems name.
pub(super) fn prompt_param(route: Route) -> &'static str {
    match route {
        Route::Chat => "messages",
        Route::Completions | Route::Completion => "prompt",
        Route::Infill => "input_prefix",
    }
}

/// A generation error as the API answers it; prompt problems name `param`.
pub(super) fn api_error(e: GenError, param: &'static str) -> ApiError {
    match e {
        GenError::Template(TemplateError::Budget(_)) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            code: Some("template_budget_exceeded"),
            param: None,
            message: e.to_string(),
        },
        GenError::PromptTooLong { .. } => ApiError {
            code: Some("context_length_exceeded"),
            ..bad(Some(param), e.to_string())
        },
        GenError::Template(_) | GenError::EmptyPrompt => bad(Some(param), e.to_string()),
        GenError::ContextFull { .. } => ApiError {
            code: Some("context_length_exceeded"),
            ..bad(Some(param), e.to_string())
        },
        GenError::Station(station_wire::client::ClientError::Refused(
            station_wire::wire::Refusal {
                status: 400 | 413, ..
            },
        )) => bad(Some(param), e.to_string()),
        GenError::NoTokenizer => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            code: Some("no_tokenizer"),
            param: None,
            message: e.to_string(),
        },
        _ => ApiError {
            status: StatusCode::BAD_GATEWAY,
            kind: "server_error",
            code: Some("station_error"),
            param: None,
            message: e.to_string(),
        },
    }
}

/// Checks what a job needs from the model before admission: a chat template for chat, the
/// fill-in-the-middle tokens for a suffix, a tokenizer for text.
pub(super) fn check_model(st: &AppState, route: Route, job: &Job) -> Result<(), ApiError> {
    match &job.prompt {
        PromptSpec::Ids(_) => Ok(()),
        _ if st.backend.tok.is_none() => Err(api_error(GenError::NoTokenizer, "")),
        PromptSpec::Chat(_) if st.template.is_none() => Err(api_error(GenError::NoTokenizer, "")),
        PromptSpec::Fim { .. } if st.fim.is_none() => {
            let param = if route == Route::Infill {
                "input_suffix"
            } else {
                "suffix"
            };
            Err(bad(
                Some(param),
                format!(
                    "{param}: model {} has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>)",
                    st.backend.model_id
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The grammar for a job's `format`: the vocabulary's trie is fetched and built once.
pub(super) fn grammar(st: &AppState, schema: &Value) -> Result<Grammar, GenError> {
    // The schema's bounds first: a refused schema costs no vocabulary fetch.
    crate::structured::check_schema(schema)?;
    let mut slot = st
        .vocab
        .lock()
        .map_err(|_| GrammarError::Vocab("a request building it failed".into()))?;
    let vocab = match slot.as_ref() {
        Some(v) => v.clone(),
        None => {
            let t = Instant::now();
            let v = Arc::new(st.backend.vocab()?);
            info!(
                tokens = v.len(),
                ms = t.elapsed().as_millis() as u64,
                "vocabulary trie for structured output built"
            );
            *slot = Some(v.clone());
            v
        }
    };
    drop(slot);
    Ok(vocab.grammar(schema)?)
}

/// A job's prompt ids, its text for `echo`, and the grammar of its format.
pub(super) type Prompted = (Vec<u32>, Option<String>, Option<Grammar>);

/// The prompt's ids, for `echo` its text, and the grammar of its `format` (station calls:
/// run on the blocking pool).
pub(super) fn prompt_tokens(st: &AppState, job: &Job) -> Result<Prompted, GenError> {
    let grammar = match &job.format {
        Some((_, schema)) => Some(grammar(st, schema)?),
        None => None,
    };
    let b = &st.backend;
    let ids = match &job.prompt {
        PromptSpec::Chat(m) => {
            let template = st.template.as_ref().ok_or(GenError::NoTokenizer)?;
            let tools = job.tools.as_ref();
            let mut ids = b.chat_tokens_with_tools(template, m, tools.map(|t| &t.list))?;
            if tools.is_some_and(|t| t.forced) {
                // A forced call: the answer starts inside the call block, under its schema.
                let open = format!("{}\n", crate::tools::OPEN);
                ids.extend(
                    b.tokenizer()?
                        .tokenize_parts(&[(&open, true)], Some(false))?,
                );
            }
            ids
        }
        PromptSpec::Text(t) => b.tokenize(t, None)?,
        PromptSpec::Ids(ids) => ids.clone(),
        PromptSpec::Mixed(parts) => {
            // The model's BOS rule once, at the start; then each part as given.
            let mut ids = match b.info.as_ref() {
                Some(i) if i.add_bos => i.bos_id.into_iter().collect(),
                _ => Vec::new(),
            };
            for p in parts {
                match p {
                    api::MixedPart::Text(t) => ids.extend(b.tokenize(t, Some(false))?),
                    api::MixedPart::Ids(i) => ids.extend(i),
                }
            }
            ids
        }
        PromptSpec::Fim {
            prefix,
            suffix,
            middle,
            extra,
        } => b.fim_prompt(
            st.fim.ok_or(GenError::NoTokenizer)?,
            prefix,
            suffix,
            middle,
            extra,
        )?,
    };
    let echo = match (&job.prompt, job.echo) {
        (_, false) => None,
        (PromptSpec::Text(t), true) => Some(t.clone()),
        (_, true) => Some(b.detokenize(&ids)?),
    };
    Ok((ids, echo, grammar))
}

/// `POST /v1/chat/completions`, `/v1/completions`, `/infill`: parse, admit, tokenize,
/// generate on the blocking pool, answer whole or as server-sent events.
pub(super) async fn completion(
    st: &Arc<AppState>,
    req: Request<Incoming>,
    route: Route,
) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let job = parse(st, req, route).await?;
    generate(st, job, route, Box::new(OpenAi), t0).await
}

/// Admits, tokenizes and runs a parsed job; `dialect` writes the answer in its API's shapes.
pub(super) async fn generate(
    st: &Arc<AppState>,
    job: Job,
    route: Route,
    mut dialect: Box<dyn Dialect>,
    t0: Instant,
) -> Result<Resp, ApiError> {
    // Admission before any station call; the slot is held from here on (RAII).
    let permit = admit(st).await?;
    let queue_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (prompt, echo, grammar, permit) = tokenize(st, &job, route, permit).await?;
    let tokenize_ms = t0.elapsed().as_secs_f64() * 1e3 - queue_ms;
    let pparam = prompt_param(route);
    // A prompt past the stations' context is refused before any of it is computed.
    st.backend
        .check_context(prompt.len())
        .map_err(|e| api_error(e, pparam))?;
    dialect.prompt(prompt.len());
    let lease = Lease::new(st, permit, &prompt)?;
    let gen = GenRequest {
        prompt,
        max_tokens: job.max_tokens,
        sampling: job.sampling.clone(),
        stops: job.stops.clone(),
        logprobs: job.logprobs,
        lookup: st.args.lookup.params().ok().flatten(),
        grammar,
    };
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Started, ApiError>>();
    let cancel = Arc::new(AtomicBool::new(false));
    let cancel_guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let task = GenTask {
        st: st.clone(),
        route,
        id: format!(
            "{}{:x}{:x}",
            Answer::id_prefix(route),
            now_s(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ),
        echo,
        job,
        gen,
        lease,
        cancel,
        tx,
        ready_tx,
        t0,
        dialect,
    };
    let stream_type = task.dialect.stream_type();
    let gen_task = tokio::task::spawn_blocking(move || task.run());
    let timing_header = move |t: &Timing| {
        format!(
            "tokenize;dur={tokenize_ms:.1}, queue;dur={queue_ms:.1}, {}",
            t.server_timing()
        )
    };
    let started = match ready_rx.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(gen_task
                .await
                .map_err(|e| internal(format!("generation task: {e}")))?
                .err()
                .unwrap_or_else(|| internal("generation ended early".into())))
        }
    };
    if started.stream {
        // The generation thread owns the rest; the body ends when it drops `tx`.
        drop(gen_task);
        return Ok(answer_stream(
            rx,
            cancel_guard,
            &timing_header(&started.timing),
            stream_type,
        ));
    }
    drop(rx);
    let _cancel_guard = cancel_guard;
    let (body, timing) = gen_task
        .await
        .map_err(|e| internal(format!("generation task: {e}")))??;
    let total = format!(
        "{}, total;dur={:.1}",
        timing_header(&timing),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(answer_whole(&body, &total))
}

/// Step 1: the body, parsed and checked against the served model.
async fn parse(st: &Arc<AppState>, req: Request<Incoming>, route: Route) -> Result<Job, ApiError> {
    let body = read_body(st, req).await?;
    let job = api::parse(route, &body, &request_limits(st))?;
    check_model(st, route, &job)?;
    Ok(job)
}

/// Step 2 (after admission): render and tokenize (station calls: blocking pool). The slot goes
/// with the work: a client that leaves does not free it while its template or schema is
/// still running.
async fn tokenize(
    st: &Arc<AppState>,
    job: &Job,
    route: Route,
    permit: OwnedSemaphorePermit,
) -> Result<
    (
        Vec<u32>,
        Option<String>,
        Option<Grammar>,
        OwnedSemaphorePermit,
    ),
    ApiError,
> {
    let pparam = prompt_param(route);
    let fparam = job.format.as_ref().map_or(pparam, |f| f.0);
    let (st2, job2) = (st.clone(), job.clone());
    let (prompted, permit) = tokio::task::spawn_blocking(move || {
        let out = prompt_tokens(&st2, &job2);
        // Counted here: the client may be gone by the time the handler would see it.
        if let Err(GenError::Template(TemplateError::Budget(_))) = &out {
            st2.metrics.template_budget.fetch_add(1, Ordering::Relaxed);
        }
        (out, permit)
    })
    .await
    .map_err(|e| internal(format!("tokenize task: {e}")))?;
    let (prompt, echo, grammar) = prompted.map_err(|e| match e {
        GenError::Grammar(GrammarError::Schema(why)) => bad(
            Some(fparam),
            format!("{fparam}: the schema is not supported: {why}"),
        ),
        e => api_error(e, pparam),
    })?;
    Ok((prompt, echo, grammar, permit))
}

/// One generation on the blocking pool, and what it reports back.
struct GenTask {
    st: Arc<AppState>,
    route: Route,
    id: String,
    echo: Option<String>,
    job: Job,
    gen: GenRequest,
    lease: Lease,
    cancel: Arc<AtomicBool>,
    /// Server-sent events, when streaming.
    tx: mpsc::Sender<Bytes>,
    /// The prefill's outcome, which decides the status line.
    ready_tx: oneshot::Sender<Result<Started, ApiError>>,
    t0: Instant,
    /// The API whose shapes the answer takes.
    dialect: Box<dyn Dialect>,
}

impl GenTask {
    /// Step 3: prefill, decode (streaming each piece when asked), count, and the whole answer
    /// (`Null` when it was streamed or the client left).
    fn run(self) -> Result<(Value, Timing), ApiError> {
        let GenTask {
            st,
            route,
            id,
            echo,
            job,
            gen,
            mut lease,
            cancel,
            tx,
            ready_tx,
            t0,
            mut dialect,
        } = self;
        // Sends the translation of one chunk (false: the client is gone).
        let send = |out: Vec<Bytes>| out.into_iter().all(|b| tx.blocking_send(b).is_ok());
        let pparam = prompt_param(route);
        let stream = job.stream;
        let t = Instant::now();
        let is_cancelled = || cancel.load(Ordering::Relaxed);
        let text_of = |tok: u32| st.backend.token_text(tok).unwrap_or_default();
        let mut answer = Answer::new(
            route,
            id.clone(),
            now_s(),
            st.served_name.clone(),
            echo,
            job.shows_logprobs(),
            &text_of,
        );
        if let Some(t) = &job.tools {
            answer = answer.with_tools(t);
        }
        if let Some(l) = &job.llama {
            answer = answer.with_llama(l.clone(), generation_settings(&job));
        }
        let session = lease
            .session
            .as_mut()
            .ok_or_else(|| internal("lease without session".into()))?;
        let g = match Generation::start(&st.backend, session, &gen, &is_cancelled) {
            Ok(g) => g,
            Err(GenError::Cancelled { prefilled }) => {
                lease.finish = "cancelled";
                st.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                st.metrics
                    .prompt_tokens
                    .fetch_add(gen.prompt.len() as u64, Ordering::Relaxed);
                st.metrics
                    .prefill_tokens
                    .fetch_add(prefilled as u64, Ordering::Relaxed);
                info!(id = %id, prefilled, prompt = gen.prompt.len(), "client went away during prefill: generation cancelled");
                return Err(internal("cancelled".into()));
            }
            Err(e) => {
                warn!(id = %id, "prefill failed: {e}");
                let _ = ready_tx.send(Err(api_error(e, pparam)));
                return Err(internal("prefill failed".into()));
            }
        };
        let prefill_timing = g.timing().clone();
        let _ = ready_tx.send(Ok(Started {
            timing: prefill_timing.clone(),
            stream,
        }));
        let gone = stream
            && answer
                .first_chunk()
                .is_some_and(|c| !send(dialect.chunk(&c)));
        let mut sent_lps = 0;
        // llama-server's `n_indent`: the text so far, and whether a line indented less than
        // asked ended the answer (then the callback's `false` is a stop, not a client gone).
        let n_indent = job.llama.as_ref().map_or(0, |l| l.n_indent);
        let (mut so_far, mut indent_stop) = (String::new(), false);
        let out = g.run_with_logprobs(|text, lps| {
            sent_lps += lps.len();
            let mut text = text;
            if n_indent > 0 {
                let before = so_far.len();
                so_far.push_str(text);
                if let Some(cut) = api::indent_cut(&so_far, n_indent) {
                    indent_stop = true;
                    text = &text[..cut.saturating_sub(before).min(text.len())];
                }
            }
            let failed = gone
                || is_cancelled()
                || (stream
                    && answer
                        .chunk(text, lps, None)
                        .is_some_and(|c| !send(dialect.chunk(&c))));
            !failed && !indent_stop
        });
        st.metrics
            .generation_us
            .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        let o = match out {
            Ok(o) => o,
            Err(e) => {
                warn!(id = %id, "generation failed: {e}");
                let e = api_error(e, pparam);
                if stream {
                    let failed = ApiError {
                        status: e.status,
                        kind: "server_error",
                        code: Some("station_error"),
                        param: None,
                        message: e.message.clone(),
                    };
                    send(dialect.stream_error(&failed));
                    send(dialect.done());
                }
                return Err(e);
            }
        };
        let mut o = o;
        if indent_stop && o.finish == Finish::Cancelled && !is_cancelled() {
            if let Some(cut) = api::indent_cut(&o.text, n_indent) {
                o.text.truncate(cut);
            }
            o.finish = Finish::Stop;
        }
        let completion = o.completion_tokens(&st.backend);
        lease.tokens = completion;
        count(&st, &id, &gen, &o, &prefill_timing, t0);
        let reason = match o.finish {
            Finish::Cancelled => {
                lease.finish = "cancelled";
                st.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                info!(id = %id, tokens = completion, "client went away: generation cancelled");
                return Ok((Value::Null, o.timing));
            }
            Finish::Stop => "stop",
            Finish::Length => "length",
        };
        lease.finish = reason;
        // The prompt tokens the session already held (its prefix reused, not computed again).
        let cached = o.prompt_tokens - o.prompt_sent;
        let usage = json!({"prompt_tokens": o.prompt_tokens, "completion_tokens": completion,
            "total_tokens": o.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}});
        let stop_type = match (o.finish, o.tokens.last()) {
            (Finish::Length, _) => "limit",
            (_, Some(&t)) if st.backend.is_eog(t) => "eos",
            _ => "word",
        };
        if job.llama.is_some() {
            answer.llama_done = Some(json!({"stop_type": stop_type, "usage": usage,
                "timings": llama_timings(&o, completion), "tokens": o.tokens}));
        }
        if stream {
            // The last chunk carries the logprobs of tokens that added no text (a stop
            // string's), so the streamed logprobs are the whole answer's.
            let rest = &o.logprobs[sent_lps.min(o.logprobs.len())..];
            let mut done = answer
                .last_chunks(&o.text, rest, reason)
                .iter()
                .all(|c| send(dialect.chunk(c)));
            if done && job.include_usage {
                done = send(dialect.chunk(&answer.usage_chunk(&usage)));
            }
            // llama-server's own routes end with their `stop: true` event, no `[DONE]`.
            if done && job.llama.is_none() {
                send(dialect.done());
            }
            return Ok((Value::Null, o.timing));
        }
        Ok((
            dialect.whole(answer.whole(&o.text, &o.logprobs, reason, &usage)),
            o.timing,
        ))
    }
}

/// llama-server's `generation_settings`: the sampling a request ran with.
fn generation_settings(job: &Job) -> Value {
    let s = &job.sampling;
    json!({"n_predict": job.max_tokens, "seed": s.seed, "temperature": s.temperature,
        "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "stop": job.stops, "stream": job.stream,
        "logit_bias": s.logit_bias.iter().map(|(id, b)| json!({"token": id, "bias": b})).collect::<Vec<_>>(),
        "n_probs": job.llama.as_ref().map_or(0, |l| l.n_probs),
        "n_indent": job.llama.as_ref().map_or(0, |l| l.n_indent)})
}

/// llama-server's `timings` from a finished generation.
fn llama_timings(o: &GenOutcome, completion: usize) -> Value {
    let (pms, dms) = (o.prefill_s * 1e3, o.decode_s * 1e3);
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({"cache_n": o.prompt_tokens - o.prompt_sent, "prompt_n": o.prompt_sent,
        "prompt_ms": pms, "prompt_per_token_ms": per(pms, o.prompt_sent),
        "prompt_per_second": rate(pms, o.prompt_sent), "predicted_n": completion,
        "predicted_ms": dms, "predicted_per_token_ms": per(dms, completion),
        "predicted_per_second": rate(dms, completion)})
}

/// A finished generation in the metrics and in `/mesh`'s last generation.
fn count(
    st: &AppState,
    id: &str,
    gen: &GenRequest,
    o: &GenOutcome,
    prefill_timing: &Timing,
    t0: Instant,
) {
    if gen.grammar.is_some() {
        let per = o.mask_s * 1e3 / o.tokens.len().max(1) as f64;
        info!(id = %id, tokens = o.tokens.len(), mask_ms_per_token = format!("{per:.3}"), decode_s = format!("{:.2}", o.decode_s), "constrained decoding");
    }
    let m = &st.metrics;
    m.prompt_tokens
        .fetch_add(o.prompt_tokens as u64, Ordering::Relaxed);
    m.prompt_tokens_reused
        .fetch_add((o.prompt_tokens - o.prompt_sent) as u64, Ordering::Relaxed);
    m.prefill_tokens
        .fetch_add(o.prompt_sent as u64, Ordering::Relaxed);
    m.completion_tokens
        .fetch_add(o.tokens.len() as u64, Ordering::Relaxed);
    m.timing(&o.timing);
    m.latency.observe(t0, &o.token_times);
    if let Ok(mut l) = st.last.lock() {
        *l = Some(LastGeneration::new(
            prefill_timing,
            &o.timing,
            o.tokens.len(),
            o.decode_s,
            now_s(),
        ));
    }
}

/// Step 4, streamed: the event stream, with the prefill's `Server-Timing`.
fn answer_stream(
    rx: mpsc::Receiver<Bytes>,
    cancel: CancelOnDrop,
    timing: &str,
    content_type: &'static str,
) -> Resp {
    let mut r = Response::new(
        SseBody {
            rx,
            _cancel: cancel,
        }
        .boxed(),
    );
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(timing) {
        h.insert("server-timing", v);
    }
    r
}

/// Step 4, whole: the JSON answer with the whole generation's `Server-Timing`.
fn answer_whole(body: &Value, timing: &str) -> Resp {
    let mut r = json_resp(StatusCode::OK, body);
    if let Ok(v) = HeaderValue::from_str(timing) {
        r.headers_mut().insert("server-timing", v);
    }
    r
}

/// The bounds and defaults every request body is parsed under (`--default-max-tokens`,
/// `--max-tokens-limit`, `--seed`, the served vocabulary).
pub(super) fn request_limits(st: &AppState) -> Limits {
    Limits {
        default_max_tokens: st.args.default_max_tokens,
        max_tokens_limit: st.args.max_tokens_limit,
        vocab: st.backend.info.as_ref().map(|i| i.vocab),
        seed: st.args.seed,
    }
}

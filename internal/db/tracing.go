package db

import (
	"context"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// Traces of the statements (X3): a span per statement, batch (the
// pipelined transactions of pipeline.go travel as batches: a span for the
// batch and one per statement in it), prepare and pool acquire, under the
// span of the request or job that ran them. Statements run outside any
// recording span (the relay's polls, the reaper) make none.
//
// What a span holds: the statement's text as written in db/queries (its
// parameters are placeholders: otelpgx records no argument unless told to
// with WithIncludeQueryParameters, which is never passed here, so no key,
// API key or body value reaches a span), its operation as the span's name,
// and no connection details (host, user, database name).

// tracer returns the pool's tracer: otelpgx behind gate.
func tracer() *gate {
	return &gate{otelpgx.NewTracer(
		otelpgx.WithDisableConnectionDetailsInAttributes(),
	)}
}

// withTracer sets cfg's tracer to ours, beside any tracer already there
// (a test's statement counter).
func withTracer(cfg *pgxpool.Config) {
	t := tracer()
	if cfg.ConnConfig.Tracer == nil {
		cfg.ConnConfig.Tracer = t
		return
	}
	cfg.ConnConfig.Tracer = multitracer.New(cfg.ConnConfig.Tracer, t)
}

// gate calls otelpgx only under a recording span: without one otelpgx
// makes no span either, but still stores a start time in every
// statement's context for its OpenTelemetry metrics, which this service
// does not export (its database metrics are Prometheus', metrics.go). So
// with tracing off a statement costs one interface call and a check more.
// A hook that started a span marks the context it returns, and only a
// marked context reaches otelpgx's end hook.
type gate struct{ t *otelpgx.Tracer }

type (
	tracedQuery   struct{}
	tracedBatch   struct{}
	tracedPrepare struct{}
	tracedAcquire struct{}
)

func recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

func (g *gate) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	return context.WithValue(g.t.TraceQueryStart(ctx, conn, data), tracedQuery{}, true)
}

func (g *gate) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(tracedQuery{}) != nil {
		g.t.TraceQueryEnd(ctx, conn, data)
	}
}

func (g *gate) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	return context.WithValue(g.t.TraceBatchStart(ctx, conn, data), tracedBatch{}, true)
}

func (g *gate) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if ctx.Value(tracedBatch{}) != nil {
		g.t.TraceBatchQuery(ctx, conn, data)
	}
}

func (g *gate) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if ctx.Value(tracedBatch{}) != nil {
		g.t.TraceBatchEnd(ctx, conn, data)
	}
}

func (g *gate) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	return context.WithValue(g.t.TracePrepareStart(ctx, conn, data), tracedPrepare{}, true)
}

func (g *gate) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	if ctx.Value(tracedPrepare{}) != nil {
		g.t.TracePrepareEnd(ctx, conn, data)
	}
}

func (g *gate) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	return context.WithValue(g.t.TraceAcquireStart(ctx, pool, data), tracedAcquire{}, true)
}

func (g *gate) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if ctx.Value(tracedAcquire{}) != nil {
		g.t.TraceAcquireEnd(ctx, pool, data)
	}
}

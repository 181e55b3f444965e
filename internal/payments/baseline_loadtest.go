//go:build loadtest

package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// PayBaseline is the load benchmark's payment baseline, compiled into
// -tags loadtest builds only: what a payment costs without idempotency.
// It does the payment's business work and nothing of the pattern's:
//
//  1. a transaction: the same checks against the order under its row lock
//     and the same payment row, inserted marked charge_sent (createPayment,
//     under a fresh charge key: there is no request key to derive it from);
//  2. one processor call (the same client, the same charge request);
//  3. a transaction: the outcome on the payment (PaymentFinish) and its
//     event in the outbox (writePaymentEvent), as recordCharge writes them.
//
// No key row, no lease, no recovery points, no lookup of earlier calls and
// no resend: a crash or a timeout between the steps leaves the payment
// charge_sent, and a retry pays again. The same rows are written (the
// payment, inserted then finished, and the outbox event), and the answer
// is the payment's, rendered as Pay renders it.
func (s *Service) PayBaseline(ctx context.Context, tenantID uuid.UUID, in PayInput) (idem.Response, error) {
	c := idem.Claim{TenantID: tenantID, Endpoint: "POST /v1/_baseline/payments", Key: uuid.NewString()}
	var p dbsqlc.Payment
	err := db.WithPipelinedTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		p, err = createPayment(ctx, tx, c, in)
		return err
	})
	if err != nil {
		if res, recorded := s.render.Failure(err); recorded {
			return res, nil // a deterministic failure, answered as Pay answers it
		}
		return idem.Response{}, err
	}
	ch, err := s.proc.CreateCharge(ctx, processor.ChargeRequest{
		Amount:        p.Amount,
		Currency:      p.Currency,
		PaymentMethod: p.PaymentMethod,
		Metadata:      map[string]string{"payment_id": p.ID.String(), "order_id": p.OrderID.String()},
	}, p.ChargeKey)
	finish := dbsqlc.PaymentFinishParams{TenantID: tenantID, ID: p.ID, SweepDelaySeconds: s.sweepDelay().Seconds()}
	var declined *processor.DeclineError
	var rejected *processor.RequestError
	var failure error
	switch {
	case errors.As(err, &declined):
		code := declined.DeclineCode
		if code == "" {
			code = declined.Code
		}
		finish.Status, finish.ChargeID, finish.DeclineCode = StatusDeclined, nonEmpty(declined.ChargeID), &code
		failure = &DeclinedError{PaymentID: p.ID, DeclineCode: code}
	case errors.As(err, &rejected):
		finish.Status, finish.FailureMessage = StatusFailed, &rejected.Message
		failure = &ProcessorRejectedError{Code: rejected.Code, Message: rejected.Message}
	case err != nil:
		return idem.Response{}, err
	default:
		finish.Status, finish.ChargeID = StatusSucceeded, &ch.ID
	}
	var row dbsqlc.Payment
	err = db.WithPipelinedTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if row, err = dbsqlc.New(tx).PaymentFinish(ctx, finish); err != nil {
			return err
		}
		db.CommitAfterNext(tx)
		return writePaymentEvent(ctx, tx, row)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Response{}, fmt.Errorf("payments: baseline payment %s was settled by someone else", p.ID)
	}
	if err != nil {
		return idem.Response{}, err
	}
	if failure != nil {
		res, _ := s.render.Failure(failure)
		return res, nil
	}
	out := paymentFrom(row)
	out.Compensations = []Compensation{}
	return s.render.Payment(out), nil
}

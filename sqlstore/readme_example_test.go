package sqlstore_test

import (
	"context"
	"database/sql"

	"github.com/idemgo/idem/sqlstore"
)

// The README's block for Run, compiled (it needs a Postgres; its parameters
// are the reader's own names). ExampleStore_Run runs the same on SQLite.
var _ = readmeRun

func readmeRun(ctx context.Context, db *sql.DB, orderID string, amount int, fingerprint []byte) error {
	// README: sql-run
	store, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres})
	if err != nil {
		return err
	}
	result, replayed, err := store.Run(ctx, "charge:"+orderID, fingerprint,
		func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`, orderID, amount)
			return []byte("charged"), err // an error rolls back the insert and the record
		})
	// README end
	_, _ = result, replayed
	return err
}

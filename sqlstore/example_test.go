package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemgo/idem/sqlstore"
	_ "modernc.org/sqlite"
)

// A charge that is one INSERT in the same database as the record: the
// first Run inserts it and records the result in one transaction; a retry
// of the same key replays the result and inserts nothing.
func ExampleStore_Run() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	// A file in WAL mode, as the store requires; on Postgres, sql.Open("pgx", dsn).
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.SQLite})
	if err != nil {
		panic(err)
	}
	if err := store.CreateSchema(ctx); err != nil { // a migration's job in production
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE charges (order_id TEXT, amount INTEGER)`); err != nil {
		panic(err)
	}

	charge := func(orderID string, amount int) {
		result, replayed, err := store.Run(ctx, "charge:"+orderID, nil,
			func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES (?, ?)`, orderID, amount)
				return []byte(fmt.Sprintf("charged %d", amount)), err // an error rolls back the insert and the record
			})
		fmt.Printf("%s, replayed %v, %v\n", result, replayed, err)
	}
	charge("order-17", 250)
	charge("order-17", 250)

	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// charged 250, replayed false, <nil>
	// charged 250, replayed true, <nil>
	// charges: 1
}

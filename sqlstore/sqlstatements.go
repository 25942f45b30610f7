package sqlstore

// The SQL text of Store, written once for both dialects in the markers
// of sqlText (sqldialect.go). The table name is the only text interpolated;
// every value is a bind parameter.

// sqlStatements are a Store's statements, built once for its dialect
// and table.
type sqlStatements struct {
	claim, readAny, read, renew, confirm, confirmLate, forget, record, release, purge string
}

// The statements, in the markers of sqlText.
const (
	// A claim is one upsert: the insert of a new key, or, in its update, the
	// take-over of an expired or forgotten claim, the expiry check in the
	// WHERE clause. A live record makes it return no row (one round trip,
	// then the read that answers Duplicate or InProgress); a separate
	// INSERT ... DO NOTHING and UPDATE would cost a third. The token exceeds
	// the old one even within one clock tick.
	sqlClaim = `INSERT INTO {t} AS r (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, {tok}, $3, NULL, {now}, {in $4})
ON CONFLICT (key) DO UPDATE SET state = 'C', owner = excluded.owner, token = {max}(excluded.token, r.token + 1),
fingerprint = excluded.fingerprint, result = NULL, recorded_at = excluded.recorded_at, expires_at = excluded.expires_at
WHERE r.state = 'F' OR r.expires_at <= {now}`
	// The claim also returns the row's state before it, for Claim.TakeOver
	// only, never for a decision: a claim ('C') there means the upsert took
	// over an expired one. On Postgres a CTE reads it (CTEs see the
	// statement's starting snapshot), so it costs no round trip; SQLite
	// evaluates RETURNING after the write, so there the claim's read of the
	// key (sqlReadAny, which the claim makes first anyway) tells it,
	// in process and under the write lock the claim holds anyway.
	sqlClaimPostgres = `WITH prev AS (SELECT state FROM {t} WHERE key = $1)
` + sqlClaim + ` RETURNING token, COALESCE((SELECT state FROM prev), '')`
	sqlClaimSQLite = sqlClaim + ` RETURNING token, ''`
	sqlReadAny     = `SELECT state, owner, token, fingerprint, result, {ttl} FROM {t} WHERE key = $1`
	sqlRead        = `SELECT state, owner, token, fingerprint, result, {ttl} FROM {t}
WHERE key = $1 AND state <> 'F' AND expires_at > {now}`
	sqlRenew = `UPDATE {t} SET expires_at = {in $4}
WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	sqlConfirm = `UPDATE {t} SET state = 'D', owner = '', fingerprint = $4, result = $5, recorded_at = {now}, expires_at = {in $6}
WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	// A late confirm records over anything but a live confirmation.
	sqlConfirmLate = `INSERT INTO {t} AS r (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'D', '', $2, $3, $4, {now}, {in $5})
ON CONFLICT (key) DO UPDATE SET state = 'D', owner = '', token = excluded.token, fingerprint = excluded.fingerprint,
result = excluded.result, recorded_at = excluded.recorded_at, expires_at = excluded.expires_at
WHERE NOT (r.state = 'D' AND r.expires_at > {now}) RETURNING token`
	sqlForget = `UPDATE {t} SET state = 'F'
WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	// Run's record: the row is its own, locked since the claim, whatever
	// its expiry says by now.
	sqlRecord = `UPDATE {t} SET state = 'D', owner = '', result = $3, recorded_at = {now}, expires_at = {in $4}
WHERE key = $1 AND token = $2 AND state = 'C'`
	// On Postgres, only in the claim's transaction, which wrote the claim
	// and so has a transaction id: after a write function sent COMMIT (or
	// ROLLBACK) through the transaction, the statement would run on its
	// own and commit a record apart from the effect. No round trip of its
	// own; SQLite asks before it (see Store.txEnded).
	sqlRecordPostgres = sqlRecord + ` AND txid_current_if_assigned() IS NOT NULL`
	// Run's release of its claim after the write function ended the
	// transaction itself: the claim is this Run's (owner and token),
	// whatever its expiry says by now.
	sqlRelease = `UPDATE {t} SET state = 'F' WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3`
	// SKIP LOCKED: never wait for (or on) a Run's transaction.
	sqlPurgePostgres = `DELETE FROM {t} WHERE key IN (
SELECT key FROM {t} WHERE expires_at <= {now} LIMIT $1 FOR UPDATE SKIP LOCKED) AND expires_at <= {now}`
	sqlPurgeSQLite = `DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE expires_at <= {now} LIMIT $1)`
)

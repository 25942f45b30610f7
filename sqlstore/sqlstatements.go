package sqlstore

// The SQL text of Store, written once for every dialect in the markers
// of sqlText (sqldialect.go), with a dialect's own statement where its SQL
// differs. The table name is the only text interpolated;
// every value is a bind parameter.

// sqlStatements are a Store's statements, built once for its dialect
// and table.
type sqlStatements struct {
	claim, readAny, read, renew, confirm, confirmLate, forget, record, release, purge         string
	quarantine, checkpoint, abandon, resolveConfirm, resolveForget, resolveClear, quarantined string
	claimOrRead, takeOver                                                                     string
	// MySQL only: the read of what a take-over carried over, the late
	// confirm's insert, the purge's delete (its key list appended per
	// batch), and whether a lease is held.
	takenOver, confirmLateInsert, purgeDelete, held string
}

// ownerResolved is the owner of a confirmation an operator recorded
// (idem.Record.Resolved). Every other confirmation has an empty owner: the
// mark needs no column of its own, and a row written before it reads as
// it did.
const ownerResolved = "idem:resolved"

// The statements, in the markers of sqlText.
const (
	// A claim is one upsert: the insert of a new key, or, in its update, the
	// take-over of an expired or forgotten claim, the expiry check in the
	// WHERE clause. A live record makes it return no row (one round trip,
	// then the read that answers Duplicate or InProgress); a separate
	// INSERT ... DO NOTHING and UPDATE would cost a third. The token exceeds
	// the old one even within one clock tick.
	//
	// The take-over of a lapsed claim ('C' past its lease) carries its
	// attempt (owner, token, when claimed), counts it, and keeps its
	// checkpoint; anything else (a forgotten claim, a confirmation or a
	// quarantine past its time) starts afresh. RETURNING sees the row as
	// written, so takeovers > 0 is what tells a take-over. A lapsed claim
	// at the limit of take-overs ($5) is not taken over: the claim returns
	// no row, and sqlQuarantine marks it.
	sqlClaim = `INSERT INTO {t} AS r (key, state, owner, token, fingerprint, result, recorded_at, expires_at,
takeovers, prior_owner, prior_token, prior_at, checkpoint)
VALUES ($1, 'C', $2, {tok}, $3, NULL, {now}, {in $4}, 0, NULL, NULL, NULL, NULL)
ON CONFLICT (key) DO UPDATE SET state = 'C', owner = excluded.owner, token = {max}(excluded.token, r.token + 1),
fingerprint = excluded.fingerprint, result = NULL, recorded_at = excluded.recorded_at, expires_at = excluded.expires_at,
takeovers = CASE WHEN r.state = 'C' THEN r.takeovers + 1 ELSE 0 END,
prior_owner = CASE WHEN r.state = 'C' THEN r.owner END,
prior_token = CASE WHEN r.state = 'C' THEN r.token END,
prior_at = CASE WHEN r.state = 'C' THEN r.recorded_at END,
checkpoint = CASE WHEN r.state = 'C' THEN r.checkpoint END
WHERE r.state = 'F' OR (r.expires_at <= {now} AND NOT (r.state = 'C' AND r.takeovers >= $5))
RETURNING token, takeovers, prior_owner, prior_token, {ms prior_at}, checkpoint`
	// Postgres's claim: the insert of a new key, or else the read of the
	// row there, in one statement and one round trip. ON CONFLICT DO
	// NOTHING neither locks nor writes the row it finds, so a duplicate is
	// a read: no WAL, no commit flush. The read sees the statement's
	// snapshot: a row committed after it is not seen, and the claim tries
	// again. 'I' marks the row this claim inserted.
	sqlClaimOrRead = `WITH ins AS (
INSERT INTO {t} (key, state, owner, token, fingerprint, result, recorded_at, expires_at, takeovers)
VALUES ($1, 'C', $2, {tok}, $3, NULL, {now}, {in $4}, 0)
ON CONFLICT (key) DO NOTHING RETURNING token)
SELECT 'I', '', token, ''::bytea, NULL::bytea, 0::bigint, 0, NULL::text, NULL::bigint, NULL::bigint, NULL::bytea FROM ins
UNION ALL
SELECT CAST(state AS text), ` + sqlColumnsAfterState + ` FROM {t} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)`
	// The take-over of a row that is not live, as the claim upsert's
	// update does it (see sqlClaim): the check and the write one statement.
	sqlTakeOver = `UPDATE {t} AS r SET state = 'C', owner = $2, token = {max}({tok}, r.token + 1),
fingerprint = $3, result = NULL, recorded_at = {now}, expires_at = {in $4},
takeovers = CASE WHEN r.state = 'C' THEN r.takeovers + 1 ELSE 0 END,
prior_owner = CASE WHEN r.state = 'C' THEN r.owner END,
prior_token = CASE WHEN r.state = 'C' THEN r.token END,
prior_at = CASE WHEN r.state = 'C' THEN r.recorded_at END,
checkpoint = CASE WHEN r.state = 'C' THEN r.checkpoint END
WHERE r.key = $1 AND (r.state = 'F' OR (r.expires_at <= {now} AND NOT (r.state = 'C' AND r.takeovers >= $5)))
RETURNING r.token, r.takeovers, r.prior_owner, r.prior_token, {ms prior_at}, r.checkpoint`
	// The columns of a record, as read answers them.
	sqlColumns           = `state, ` + sqlColumnsAfterState
	sqlColumnsAfterState = `owner, token, fingerprint, result, {ttl}, takeovers, prior_owner, prior_token, {ms prior_at}, checkpoint`
	sqlReadAny           = `SELECT ` + sqlColumns + ` FROM {t} WHERE key = $1`
	sqlRead              = `SELECT ` + sqlColumns + ` FROM {t}
WHERE key = $1 AND state <> 'F' AND expires_at > {now}`
	// A lapsed claim at the limit of take-overs: the crash loop stops here,
	// the key quarantined for the retention ($3).
	sqlQuarantine = `UPDATE {t} SET state = 'Q', expires_at = {in $3}
WHERE key = $1 AND state = 'C' AND expires_at <= {now} AND takeovers >= $2`
	sqlCheckpoint = `UPDATE {t} SET checkpoint = $4
WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	// Why a holder gives its claim up (idem.Abandoner): kept in the claim's
	// result column, which a claim has no other use for, so that no column
	// is added; a take-over, a confirmation or a settlement writes over it.
	sqlAbandon = `UPDATE {t} SET result = $4
WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	// An operator's verdict on a quarantined key. The confirmation takes a
	// token of its own, so that the last attempt's late confirm is told
	// another was kept, and is marked an operator's by its owner (see
	// ownerResolved); a forgotten key starts afresh.
	sqlResolveConfirm = `UPDATE {t} SET state = 'D', owner = '` + ownerResolved + `', token = {max}({tok}, token + 1), result = $2,
recorded_at = {now}, expires_at = {in $3}
WHERE key = $1 AND state = 'Q' AND expires_at > {now}`
	sqlResolveForget = `UPDATE {t} SET state = 'F' WHERE key = $1 AND state = 'Q' AND expires_at > {now}`
	// An operator's forced forget: anything but a live claim (and a row
	// already forgotten) becomes a forgotten claim, its token kept.
	sqlResolveClear = `UPDATE {t} SET state = 'F' WHERE key = $1 AND state <> 'F' AND NOT (state = 'C' AND expires_at > {now})`
	sqlQuarantined  = `SELECT ` + sqlColumns + `, key FROM {t} WHERE state = 'Q' AND expires_at > {now} LIMIT $1`
	sqlRenew        = `UPDATE {t} SET expires_at = {in $4}
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
	// A row goes at its expiry, but a lapsed claim a retention later
	// ($2, the retention in negative milliseconds): until then the next
	// claim takes it over and is told so. SKIP LOCKED: never wait for (or
	// on) a Run's transaction.
	sqlPurgeGone     = `expires_at <= {now} AND (state <> 'C' OR expires_at <= {in $2})`
	sqlPurgePostgres = `DELETE FROM {t} WHERE key IN (
SELECT key FROM {t} WHERE ` + sqlPurgeGone + ` LIMIT $1 FOR UPDATE SKIP LOCKED) AND ` + sqlPurgeGone
	sqlPurgeSQLite = `DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE ` + sqlPurgeGone + ` LIMIT $1)`

	// MySQL has no RETURNING, and no upsert with a WHERE clause: ON
	// DUPLICATE KEY UPDATE evaluates each assignment after the ones before
	// it, so a guard over state and expires_at would see a half-written
	// row. A claim there reads first, as on SQLite (a duplicate is that
	// read, with no lock), then inserts a new key; when the key has a row,
	// it takes over a lapsed or forgotten claim in one UPDATE whose WHERE
	// clause holds the expiry check and the limit of take-overs, as
	// sqlClaim's does. LAST_INSERT_ID(expr) hands the token back in the
	// statement's reply; a take-over, rarer, reads what it carried over
	// (sqlTakenOverMySQL). Never INSERT IGNORE, which would also turn a key
	// too long for its column into a cut one: a key inserted since the read
	// fails the INSERT with a duplicate key, and the claim goes on to the
	// take-over.
	sqlClaimMySQL = `INSERT INTO {t} (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, LAST_INSERT_ID({tok}), $3, NULL, {now}, {in $4})`
	// MySQL assigns left to right, each assignment seeing the ones before
	// it: what the take-over carries over is read from the old row first,
	// and state, owner, token and recorded_at are overwritten after.
	sqlTakeOverMySQL = `UPDATE {t} SET takeovers = CASE WHEN state = 'C' THEN takeovers + 1 ELSE 0 END,
prior_owner = CASE WHEN state = 'C' THEN owner END, prior_token = CASE WHEN state = 'C' THEN token END,
prior_at = CASE WHEN state = 'C' THEN recorded_at END, checkpoint = CASE WHEN state = 'C' THEN checkpoint END,
state = 'C', owner = $2, token = LAST_INSERT_ID({max}({tok}, token + 1)), fingerprint = $3, result = NULL,
recorded_at = {now}, expires_at = {in $4}
WHERE key = $1 AND (state = 'F' OR (expires_at <= {now} AND NOT (state = 'C' AND takeovers >= $5)))`
	sqlTakenOverMySQL = `SELECT takeovers, prior_owner, prior_token, {ms prior_at}, checkpoint FROM {t} WHERE key = $1 AND token = $2`
	// Whether a lease is live, for an UPDATE that changed nothing (see
	// Store.heldUnchanged).
	sqlHeldMySQL = `SELECT count(*) FROM {t} WHERE key = $1 AND state = 'C' AND owner = $2 AND token = $3 AND expires_at > {now}`
	// A late confirm on MySQL: the UPDATE of a row that is anything but a
	// live confirmation, or, when there is no row, the INSERT.
	sqlConfirmLateMySQL = `UPDATE {t} SET state = 'D', owner = '', token = $2, fingerprint = $3, result = $4,
recorded_at = {now}, expires_at = {in $5}
WHERE key = $1 AND NOT (state = 'D' AND expires_at > {now})`
	sqlConfirmLateInsertMySQL = `INSERT INTO {t} (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'D', '', $2, $3, $4, {now}, {in $5})`
	// As on Postgres, only inside the claim's transaction: after a COMMIT
	// sent through the transaction, the record would run on its own.
	sqlRecordMySQL = sqlRecord + ` AND @@in_transaction = 1`
	// MySQL deletes no row found by a subquery on the same table, and skips
	// locked rows only in a SELECT: its purge locks a batch of rows gone,
	// skipping those a Run holds, then deletes them by key, in one
	// transaction.
	sqlPurgeSelectMySQL = `SELECT key FROM {t} WHERE ` + sqlPurgeGone + ` ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED`
	sqlPurgeDeleteMySQL = `DELETE FROM {t} WHERE key IN (`
)

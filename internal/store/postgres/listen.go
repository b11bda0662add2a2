package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// WatchEvents calls wake with the project id of every event any replica
// appends (LISTEN on EventChannel over a connection of its own), until ctx
// ends. Whenever the connection is (re)established it calls wake("") (every
// project), since notifications sent while it was down are lost; readers
// then look at the store, which has every event.
func (s *Store) WatchEvents(ctx context.Context, wake func(projectID string)) error {
	backoff := 100 * time.Millisecond
	for {
		err := s.listen(ctx, wake)
		if ctx.Err() != nil {
			return nil
		}
		s.logf("postgres: event listener: %v (reconnecting in %v)", err, backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

// listenerName is the application_name of WatchEvents' connection.
const listenerName = "space-events"

func (s *Store) listen(ctx context.Context, wake func(string)) error {
	cc := s.connConfig.Copy()
	cc.RuntimeParams["application_name"] = listenerName
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `LISTEN `+EventChannel); err != nil {
		return err
	}
	wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n == nil {
			return errors.New("listen: no notification")
		}
		wake(n.Payload)
	}
}

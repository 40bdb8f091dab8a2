package selection

import (
	"context"
	"time"
)

// MaintainEvery runs Maintain every interval until ctx ends. It is the host side
// of the service's upkeep (the one timer), for hosts to run in a goroutine of
// their own: `go svc.MaintainEvery(ctx, 5*time.Second)`. The service never
// starts it itself.
func (s *Service) MaintainEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Maintain(ctx)
		}
	}
}

package selection

import (
	"errors"
	"slices"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// SetPolicy replaces the selection policy, for instance when a configuration
// reload names another policy or other parameters. Requests that already
// loaded the old policy finish with it; every request that starts afterwards
// uses p, its Costs included. A policy without a scorer or a picker, or with
// cost weights a router configuration would refuse, is a 400
// (KindBadRequest) and changes nothing. The service keeps its own copy of p.
func (s *Service) SetPolicy(p scheduler.Policy) error {
	if err := validPolicy(&p, s.router); err != nil {
		return apierr.Wrap(KindBadRequest, err)
	}
	s.policy.Store(clonePolicy(p))
	return nil
}

// validPolicy checks what Select relies on: a scorer and a picker, and cost
// weights in the ranges the router configuration's own weights must respect
// (a negative temperature or credit would make costs meaningless).
func validPolicy(p *scheduler.Policy, rc routerconfig.Config) error {
	if p.Scorer == nil || p.Picker == nil {
		return errors.New("a selection policy needs a scorer and a picker")
	}
	if p.Costs != nil {
		// rc itself was validated by New: only the weights can fail here.
		if err := withCosts(rc, *p.Costs).Validate(); err != nil {
			return err
		}
	}
	return nil
}

// clonePolicy copies p deep enough that the caller's later edits of its
// filter slice or cost weights do not reach the service, and the service's
// copy never reaches the caller.
func clonePolicy(p scheduler.Policy) *scheduler.Policy {
	p.Filters = slices.Clone(p.Filters)
	if p.Costs != nil {
		c := *p.Costs
		p.Costs = &c
	}
	return &p
}

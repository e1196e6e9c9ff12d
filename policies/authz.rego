# Built-in memory authorization (interface: "Built-in default behaviour" 1 and 5).
#
# Direct write, read and delete are allowed only inside the caller's own subtree ["user", <user_id>, ...].
# Roles are deliberately not consulted: the admin role widens search and list (filter.rego), never direct access.
# Replace this file through --policy-dir / SERVICE_POLICY_DIR; a directory without authz.rego keeps this one.
package memories.authz

import rego.v1

default decision := {"allow": false, "reason": "access denied"}

decision := {"allow": true} if {
	count(input.namespace) >= 2
	input.namespace[0] == "user"
	input.namespace[1] == input.context.user_id
}

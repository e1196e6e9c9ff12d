# Built-in attribute derivation (interface: "Built-in default behaviour" 2).
#
# The attributes are stored in plaintext next to the encrypted value and copied to the vector store, so they are
# limited to the namespace owner: {"namespace": <first segment>, "sub": <second segment>}. A namespace of one segment
# has no owner, hence no attributes.
package memories.attributes

import rego.v1

default attributes := {}

attributes := {"namespace": input.namespace[0], "sub": input.namespace[1]} if {
	count(input.namespace) >= 2
}

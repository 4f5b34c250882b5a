/* Calls f and its gradient from the library that
 *   adjoint build examples/aot/model.adj --entry f --with-grad -o libf.so
 * writes (with its header f.h). */
#include <stdio.h>
#include "f.h"

int main(void) {
    double w = 0.7;
    double x[3] = {0.5, -1.25, 2.0};
    int64_t x_shape[1] = {3};
    adj_tensor in[2] = {
        {&w, NULL, 0, ADJ_F64},     /* a scalar: rank 0 */
        {x, x_shape, 1, ADJ_F64},   /* a vector of 3 */
    };

    double value;
    adj_tensor out[1] = {{&value, NULL, 0, ADJ_F64}};
    if (f(in, 2, out, 1) != ADJ_OK) {
        fprintf(stderr, "f: %s\n", adjoint_last_error());
        return 1;
    }

    double dw, dx[3];
    adj_tensor grad[2] = {{&dw, NULL, 0, ADJ_F64}, {dx, x_shape, 1, ADJ_F64}};
    if (f_grad(in, 2, grad, 2) != ADJ_OK) {
        fprintf(stderr, "f_grad: %s\n", adjoint_last_error());
        return 1;
    }
    printf("f = %.17g\n", value);
    printf("df/dw = %.17g\n", dw);
    printf("df/dx = %.17g %.17g %.17g\n", dx[0], dx[1], dx[2]);
    return 0;
}
